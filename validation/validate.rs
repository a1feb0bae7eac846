//! Real-hardware validation: device-count invariance and the quickstart on whatever PJRT
//! plugin is given, written as a small JSON report.
//!
//! ```text
//! cargo run --release --example validate -- [--plugin cpu|cuda|tpu|PATH] [--cpu-devices N] [--out FILE]
//! ```
//!
//! `validation/run.sh` finds the accelerator, provisions its plugin and calls this.
//! Tolerance: the update on 1 device and on all devices agrees to 1e-5 relative in norm per
//! leaf (semantics.md, guarantee 1); the quickstart's mean loss must fall.

use std::path::PathBuf;
use std::time::Instant;

use shardes::hlo::es::{strategy, ShardedES, StrategySpec};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::runtime::{Client, ClientOptions, Plugin};
use shardes::Trainer;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    plugin: PathBuf,
    cpu_devices: Option<usize>,
    out: PathBuf,
}

fn args() -> Res<Args> {
    let mut plugin = std::env::var_os("SHARDES_PJRT_PLUGIN").map(PathBuf::from);
    let mut cpu_devices = None;
    let mut out = PathBuf::from("validation/report.json");
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--plugin" => plugin = Some(shardes::runtime::plugin::resolve(&val()?)?),
            "--cpu-devices" => cpu_devices = Some(val()?.parse()?),
            "--out" => out = PathBuf::from(val()?),
            other => {
                return Err(
                    format!("unknown argument {other}; use --plugin, --cpu-devices, --out").into(),
                )
            }
        }
    }
    // `cuda`/`tpu` resolve to the pinned plugins (found in the Python environment, else
    // provisioned). Without --plugin: the default discovery (xla_extension/, then the provisioned CPU plugin).
    let plugin = match plugin {
        Some(p) => p,
        None => shardes::runtime::plugin::locate(None)?,
    };
    Ok(Args {
        plugin,
        cpu_devices,
        out,
    })
}

fn update(
    client: &Client,
    spec: &str,
    n: usize,
    devices: usize,
    generations: usize,
) -> Res<(Vec<Vec<f32>>, Vec<f32>, f64)> {
    let tb = TransformerBlock::QUICKSTART;
    let k = key(0)?;
    let params = tb.init(k)?;
    let batch = tb.make_batch(fold_in(k, 1))?;
    let spec: StrategySpec = spec.parse()?;
    let es = ShardedES::new(strategy::from_spec(&spec), n, 0.01, 0.01, devices)?;
    let mut t = Trainer::with_state(client, &es, &tb, &params, k, &[batch.x, batch.target], 0)?;
    let mut means = Vec::new();
    let start = Instant::now();
    for _ in 0..generations {
        let f = t.step()?;
        means.push(f.iter().sum::<f32>() / f.len() as f32);
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / generations as f64;
    let p1 = t.params()?;
    Ok((diff(&params, &p1), means, ms))
}

fn diff(a: &ParamTree, b: &ParamTree) -> Vec<Vec<f32>> {
    a.leaves()
        .iter()
        .zip(b.leaves())
        .map(|((_, x), (_, y))| y.data().iter().zip(x.data()).map(|(p, q)| p - q).collect())
        .collect()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

fn main() -> Res<()> {
    let a = args()?;
    let plugin = Plugin::load(&a.plugin)?;
    let client = Client::new(
        plugin.clone(),
        ClientOptions {
            cpu_device_count: a.cpu_devices,
        },
    )?;
    let d = client.device_count();
    println!(
        "platform {} with {d} devices ({})",
        client.platform_name(),
        a.plugin.display()
    );
    let mut inv = Vec::new();
    let mut ok = true;
    for spec in [
        "mirrored(lowrank(r=1))",
        "lowrank(r=2)",
        "mirrored(seed_regenerated(chunk=4))",
    ] {
        let n = 32 * d;
        let (u1, _, _) = update(&client, spec, n, 1, 1)?;
        let (ud, _, _) = update(&client, spec, n, d, 1)?;
        let worst = u1
            .iter()
            .zip(&ud)
            .map(|(x, y)| rel(x, y))
            .fold(0.0, f64::max);
        println!("invariance {spec}: 1 vs {d} devices, max per-leaf rel err {worst:e}");
        ok &= worst <= 1e-5;
        inv.push(serde_json::json!({"strategy": spec, "n": n, "max_rel_err": worst, "pass": worst <= 1e-5}));
    }
    let n = if 128 % d == 0 { 256 } else { 2 * d * 16 };
    let (_, means, ms) = update(&client, "mirrored(lowrank(r=1))", n, d, 30)?;
    let falls = means[29] < means[0];
    ok &= falls;
    for s in [0, 10, 20, 29] {
        println!("quickstart step {s:2}: mean loss {:.6}", means[s]);
    }
    println!("quickstart: {ms:.2} ms/generation on {d} devices; loss falls: {falls}");
    let report = serde_json::json!({
        "platform": client.platform_name(),
        "devices": d,
        "plugin": a.plugin.display().to_string(),
        "xla_version": plugin.xla_version(),
        "invariance": inv,
        "quickstart": {"n": n, "mean_loss": [means[0], means[10], means[20], means[29]], "falls": falls, "ms_per_generation": ms},
        "pass": ok,
    });
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&report)?)?;
    println!(
        "report: {} ({})",
        a.out.display(),
        if ok { "pass" } else { "FAIL" }
    );
    if ok {
        Ok(())
    } else {
        Err("validation failed; see the report".into())
    }
}
