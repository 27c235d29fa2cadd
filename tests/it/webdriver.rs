//! A real headless Chromium, driven through chromedriver over the W3C WebDriver protocol
//! (plain JSON over HTTP, spoken with curl like the rest of these tests).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);

/// One browser session. Dropping it ends the session and kills chromedriver's process
/// group, where every Chromium process it started lives.
pub struct Browser {
    base: String,
    session: String,
    _driver: Guard,
}

impl Browser {
    /// chromedriver on a free loopback port, and a session of headless Chromium that takes
    /// the test hub's self-signed certificate, with its profile under `dir`.
    pub fn start(dir: &Path) -> Browser {
        let port = free_port();
        let log = fs::File::create(dir.join("chromedriver.log")).expect("chromedriver log");
        let mut driver = Guard::new(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .process_group(0)
                .spawn()
                .expect("chromedriver (scripts/install-test-prerequisites.sh installs it)"),
        );
        let pid = driver.pid();
        driver.own_group(pid);
        let base = format!("http://127.0.0.1:{port}");
        wait_for(LIMIT, "chromedriver ready", || {
            let (code, body) = call(&base, "GET", "/status", None);
            let v: Value = serde_json::from_str(&body).ok()?;
            (code == 200 && v["value"]["ready"] == true).then_some(())
        });
        let profile = dir.join("chromium-profile");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let (code, body) = call(&base, "POST", "/session", Some(&caps));
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a Chromium session ({code}): {body}"))
            .to_owned();
        Browser {
            base,
            session,
            _driver: driver,
        }
    }

    /// A command on this session; its `value`, or a panic naming what it was.
    fn cmd(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let url = format!("/session/{}{path}", self.session);
        let (code, text) = call(&self.base, method, &url, body);
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(code, 200, "WebDriver {method} {path}: {text}");
        v["value"].clone()
    }

    pub fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(&json!({"url": url})));
    }

    pub fn url(&self) -> String {
        self.cmd("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The element `css` finds, once there is one.
    fn find(&self, css: &str) -> String {
        wait_for(
            LIMIT,
            &format!("an element {css} on {}", self.url()),
            || {
                let url = format!("/session/{}/element", self.session);
                let body = json!({"using": "css selector", "value": css});
                let (code, text) = call(&self.base, "POST", &url, Some(&body));
                let v: Value = serde_json::from_str(&text).ok()?;
                let id = v["value"]
                    .as_object()?
                    .iter()
                    .find(|(k, _)| k.starts_with("element-"))?
                    .1
                    .as_str()?
                    .to_owned();
                (code == 200).then_some(id)
            },
        )
    }

    /// Whether any element matches `css` now.
    pub fn has(&self, css: &str) -> bool {
        let v = self.cmd(
            "POST",
            "/elements",
            Some(&json!({"using": "css selector", "value": css})),
        );
        v.as_array().is_some_and(|a| !a.is_empty())
    }

    /// The rendered text of the first element `css` finds.
    pub fn text(&self, css: &str) -> String {
        let id = self.find(css);
        self.cmd("GET", &format!("/element/{id}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits until `css`'s text satisfies `ok`, and returns it.
    pub fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        wait_for(LIMIT, what, || {
            let url = format!("/session/{}/elements", self.session);
            let body = json!({"using": "css selector", "value": css});
            let (_, text) = call(&self.base, "POST", &url, Some(&body));
            let v: Value = serde_json::from_str(&text).ok()?;
            let el = v["value"]
                .as_array()?
                .first()?
                .as_object()?
                .values()
                .next()?;
            let path = format!("/session/{}/element/{}/text", self.session, el.as_str()?);
            let (code, text) = call(&self.base, "GET", &path, None);
            let t = serde_json::from_str::<Value>(&text).ok()?["value"]
                .as_str()?
                .to_owned();
            (code == 200 && ok(&t)).then_some(t)
        })
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            Some(&json!({"text": text})),
        );
    }

    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/click"), Some(&json!({})));
    }

    /// Runs `script` in the page and returns what it returns.
    pub fn script(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// The browser's cookies for the page it shows, as WebDriver describes them.
    pub fn cookies(&self) -> Vec<Value> {
        self.cmd("GET", "/cookie", None)
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &Path) -> PathBuf {
        let data = self.cmd("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().expect("screenshot data"))
            .expect("screenshot base64");
        fs::write(path, png).expect("screenshot");
        path.to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closes Chromium cleanly; the guard then takes chromedriver and anything left.
        let _ = call(
            &self.base,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
    }
}

/// One WebDriver request with curl: the status and body.
fn call(base: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "60",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(b) = body {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &b.to_string(),
        ]);
    }
    let out = cmd.arg(format!("{base}{path}")).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}
