#![allow(unreachable_pub)]

//! Integration tests: the real binary, real processes, real files.
//!
//! One test binary (modules below) keeps link time down.

mod access;
mod agent;
mod cli;
#[cfg(target_os = "linux")]
mod container;
mod dashboard;
mod disk;
mod drain;
mod fixtures;
mod hub;
mod hub_agent;
mod hub_jobs;
mod inputs;
#[cfg(target_os = "linux")]
mod install;
mod jobs;
mod layout;
mod lock;
mod log_lines;
mod metrics;
#[cfg(target_os = "linux")]
mod package;
mod prerequisites;
mod readme;
mod release;
mod replicas;
mod rollout;
mod routing;
mod store_copy;
mod supervise;
mod supervisor_api;
#[cfg(target_os = "linux")]
mod systemd;
#[cfg(target_os = "linux")]
mod systemd_package;
#[cfg(target_os = "linux")]
mod systemd_upgrade;
mod upgrade;
mod upgrade_drain;
mod webdriver;
