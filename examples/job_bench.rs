//! Job throughput and latency of a running runner, against a raw fork/exec/wait loop in the
//! same process. Used by `bench/jobs.sh`; see docs/benchmarks.md.
//!
//!   job_bench SOCKET JOBS CONCURRENCY

use std::path::PathBuf;
use std::time::{Duration, Instant};

use railgrid::proto::job::JobSpec;
use railgrid::runner::client::Client;
use railgrid::runner::job::Stream;

#[path = "common/first_byte.rs"]
mod first_byte;
use first_byte::FirstByte;

fn spec(argv: &[&str]) -> JobSpec {
    JobSpec::from_argv(argv.iter().copied())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let socket = PathBuf::from(
        args.get(1)
            .ok_or_else(|| anyhow::anyhow!("usage: job_bench SOCKET JOBS CONCURRENCY"))?,
    );
    let jobs: usize = args.get(2).map_or(Ok(1000), |s| s.parse())?;
    let conc: usize = args.get(3).map_or(Ok(4), |s| s.parse())?;

    // Raw: fork/exec/wait of `true`, one after another.
    let t = Instant::now();
    for _ in 0..jobs {
        std::process::Command::new("true").status()?;
    }
    let raw = jobs as f64 / t.elapsed().as_secs_f64();

    // Runner: submit and wait for each job through the API, `conc` clients at once.
    let t = Instant::now();
    let mut handles = Vec::new();
    for w in 0..conc {
        let socket = socket.clone();
        let n = jobs / conc + usize::from(w < jobs % conc);
        handles.push(tokio::spawn(async move {
            let client = Client::new(&socket);
            for _ in 0..n {
                let (_, sub) = client.submit(&spec(&["true"])).await?;
                let rec = client.wait(&sub.id).await?;
                anyhow::ensure!(
                    rec.exit_code == Some(0),
                    "job {} ended {:?}",
                    rec.id,
                    rec.state
                );
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let runner = jobs as f64 / t.elapsed().as_secs_f64();

    // Latency: submit to the first byte of output, one job at a time.
    let client = Client::new(&socket);
    let mut lat = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let (_, sub) = client.submit(&spec(&["echo", "x"])).await?;
        let mut first = FirstByte(None, t);
        client
            .output(&sub.id, Stream::Stdout, true, &mut first)
            .await?;
        lat.push(
            first
                .0
                .ok_or_else(|| anyhow::anyhow!("no output from {}", sub.id))?,
        );
    }
    lat.sort();
    println!("raw_jobs_per_sec={raw:.0}");
    println!("runner_jobs_per_sec={runner:.0}");
    println!("ratio={:.2}", runner / raw);
    println!(
        "latency_p50_ms={:.2}",
        percentile(&lat, 0.5).as_secs_f64() * 1000.0
    );
    println!(
        "latency_p99_ms={:.2}",
        percentile(&lat, 0.99).as_secs_f64() * 1000.0
    );
    Ok(())
}
