//! `shardes estimate` and `[problem] name = "quadratic"` end to end: the report on a small
//! quadratic (every coupling of the config's strategy, a plot), a quadratic run that
//! learns, and bad input refused with a hint (sobol on a full-rank strategy, an unknown
//! coupling, a bad condition number, a population the devices cannot split).

use crate::common::*;

fn quadratic(strategy: &str, extra: &str) -> String {
    format!(
        "devices = 2\n\n[problem]\nname = \"quadratic\"\nrows = 6\ncols = 4\ncondition = 10.0\n{extra}\n\
         [es]\nstrategy = \"{strategy}\"\nn = 16\nsigma = 0.05\nlr = 0.02\n\n[run]\n\
         generations = 20\nout = \"OUT\"\n"
    )
}

#[test]
fn estimate_reports_every_coupling_and_draws_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let text = quadratic("mirrored(lowrank(r=1))", "");
    let cfg = write(dir.path(), "q.toml", &text);
    let plot = dir.path().join("cos.svg");
    let estimate = |args: &[&str]| ok(&[&["estimate", s(&cfg)][..], args].concat()).0;
    let stdout = estimate(&["--repeats", "3", "--n", "8,32", "--plot", s(&plot)]);
    assert!(
        stdout.contains("reference  the analytic gradient"),
        "{stdout}"
    );
    for s in [
        "mirrored(lowrank(r=1))  ",
        "mirrored(lowrank(r=1, coupling=orthogonal_hd))",
        "mirrored(lowrank(r=1, coupling=sobol))",
    ] {
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with(s)).count(),
            2,
            "{s}: {stdout}"
        );
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("coupling=sobol"),
        "{svg:.200}"
    );
    // A full-rank strategy takes orthogonal_hd but not sobol: two rows per n.
    let stdout = estimate(&[
        "--repeats",
        "2",
        "--n",
        "8",
        "--strategies",
        "mirrored(seed_regenerated); mirrored(seed_regenerated(coupling=orthogonal_hd))",
    ]);
    assert!(
        stdout.contains("mirrored(seed_regenerated(coupling=orthogonal_hd))"),
        "{stdout}"
    );
}

#[test]
fn a_quadratic_run_learns() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let text = quadratic("mirrored(lowrank(r=1, coupling=orthogonal_hd))", "")
        .replace("OUT", out.to_str().unwrap());
    let (stdout, _) = ok(&["run", s(&write(dir.path(), "q.toml", &text))]);
    assert!(
        stdout.contains("quadratic (w 6×4, b 4, condition 10)"),
        "{stdout}"
    );
    let m = metrics(&out);
    assert_eq!(m.len(), 20);
    assert!(
        m[19].fitness_mean < 0.8 * m[0].fitness_mean,
        "{} → {}",
        m[0].fitness_mean,
        m[19].fitness_mean
    );
}

#[test]
fn bad_couplings_and_quadratics_are_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |name: &str, text: String| write(dir.path(), name, &text);
    let sobol = cfg(
        "s.toml",
        quadratic("mirrored(seed_regenerated(coupling=sobol))", ""),
    );
    refused(
        &["run", sobol.to_str().unwrap()],
        "coupling=sobol needs low-rank factors",
        "",
    );
    let unknown = cfg("u.toml", quadratic("lowrank(r=1, coupling=halton)", ""));
    refused(
        &["estimate", unknown.to_str().unwrap()],
        "unknown coupling \"halton\"",
        "",
    );
    let good = cfg("g.toml", quadratic("lowrank(r=1)", ""));
    refused(
        &[
            "estimate",
            good.to_str().unwrap(),
            "--strategies",
            "iid_gaussian(coupling=sobol)",
        ],
        "coupling=sobol needs low-rank factors",
        "separate strategies with ';'",
    );
    refused(
        &["estimate", good.to_str().unwrap(), "--n", "9"],
        "at n = 9",
        "multiple of devices",
    );
    let flat = cfg(
        "c.toml",
        quadratic("lowrank(r=1)", "").replace("condition = 10.0", "condition = 0.5"),
    );
    refused(
        &["run", flat.to_str().unwrap()],
        "problem.condition = 0.5 is invalid",
        "condition a finite number of at least 1",
    );
}
