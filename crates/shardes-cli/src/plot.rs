//! `shardes plot`: a run's curves as SVG or PNG, several runs overlaid with a legend.
//!
//! Panels: fitness mean per generation over its min–max band; ms per generation; and, when
//! any run has `eval.jsonl`, the held-out mean reward (solid), accuracy (dashed) and format
//! rate (dotted). Lines are read leniently: extra fields are ignored, non-finite values
//! (`"NaN"`, `"inf"`, `"-inf"`, `null`) leave a gap, and an unparseable line (a write cut
//! short by a kill) is skipped; only a file with no usable line at all is an error.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use crate::config::ConfigError;

/// Arguments of `shardes plot`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The output format follows --output's extension: .svg (text as SVG text) or .png (labels \
drawn with an embedded DejaVu Sans, no system fonts needed). Without --output, one run is \
drawn to OUT_DIR/curves.svg and several runs to ./curves.svg, one legend entry per run \
named by its directory.")]
pub struct PlotArgs {
    /// Run directories (`run.out` of `shardes run`), each with metrics.jsonl; eval.jsonl is
    /// drawn too when present. Several directories overlay their curves.
    #[arg(value_name = "OUT_DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where to write the plot, `.svg` or `.png` [default: OUT_DIR/curves.svg for one run,
    /// ./curves.svg for several].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// The file `shardes run` refreshes at every checkpoint.
pub const CURVES_FILE: &str = "curves.svg";

/// Draws `out_dir`'s curves to `out_dir/curves.svg` and returns that path.
///
/// `shardes run` calls this at every checkpoint; a viewer never sees a half-written file.
pub fn write_curves(out_dir: &Path) -> Result<PathBuf> {
    let run = load_run(out_dir, name_of(out_dir))?;
    let path = out_dir.join(CURVES_FILE);
    render(std::slice::from_ref(&run), &path, Format::Svg)?;
    Ok(path)
}

/// `shardes plot`: draws the runs and prints where the plot went.
pub fn run(args: &PlotArgs) -> Result<()> {
    let output = match (&args.output, args.dirs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.join(CURVES_FILE),
        (None, _) => PathBuf::from(CURVES_FILE),
    };
    let format = Format::of(&output)?;
    let names = run_names(&args.dirs);
    let mut runs = Vec::with_capacity(args.dirs.len());
    for (dir, name) in args.dirs.iter().zip(names) {
        let run = load_run(dir, name)?;
        for s in &run.skipped {
            eprintln!("warning: {s}");
        }
        runs.push(run);
    }
    render(&runs, &output, format)?;
    println!("wrote {}", output.display());
    Ok(())
}

fn user(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
    ConfigError {
        message: message.into(),
        hint: hint.into(),
    }
    .into()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Svg,
    Png,
}

impl Format {
    fn of(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(user(
                format!("--output {} has no .svg or .png extension", path.display()),
                "name the file e.g. curves.svg or curves.png; the extension picks the format",
            )),
        }
    }
}

/// One generation of `metrics.jsonl`; `None` where the value is missing or not finite.
#[derive(Debug, Clone, PartialEq)]
struct Gen {
    generation: f64,
    mean: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    ms: Option<f64>,
}

/// One line of `eval.jsonl`.
#[derive(Debug, Clone, PartialEq)]
struct Eval {
    generation: f64,
    mean_reward: Option<f64>,
    accuracy: Option<f64>,
    format_rate: Option<f64>,
}

/// A run directory's curves.
#[derive(Debug, Clone)]
struct Run {
    name: String,
    gens: Vec<Gen>,
    evals: Vec<Eval>,
    /// One line per file with skipped lines, for the user.
    skipped: Vec<String>,
}

/// The legend names: each directory's name, or the path as given where two names collide.
fn run_names(dirs: &[PathBuf]) -> Vec<String> {
    let names: Vec<String> = dirs.iter().map(|d| name_of(d)).collect();
    names
        .iter()
        .zip(dirs)
        .map(|(n, d)| {
            if names.iter().filter(|m| *m == n).count() > 1 {
                d.display().to_string()
            } else {
                n.clone()
            }
        })
        .collect()
}

fn name_of(dir: &Path) -> String {
    // `.` or `..` have no file name of their own; the absolute path does.
    let named = dir.file_name().map(PathBuf::from).or_else(|| {
        std::fs::canonicalize(dir)
            .ok()?
            .file_name()
            .map(PathBuf::from)
    });
    match named {
        Some(n) => n.to_string_lossy().into_owned(),
        None => dir.display().to_string(),
    }
}

/// A finite number: a JSON number, or nothing for `null`, a non-finite string or a missing key.
fn finite(v: Option<&Value>) -> Option<f64> {
    v?.as_f64().filter(|x| x.is_finite())
}

/// The lines of `path` turned into points by `parse`; unparseable lines are skipped and
/// counted, and a file with no usable line is an error naming the first bad line.
fn read_lines<T>(
    path: &Path,
    parse: impl Fn(&Value) -> Result<T, String>,
    skipped: &mut Vec<String>,
) -> Result<Vec<T>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    let mut first_bad: Option<(usize, String)> = None;
    let mut bad = 0usize;
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Value>(&line)
            .map_err(|e| format!("not JSON ({e})"))
            .and_then(|v| parse(&v));
        match parsed {
            Ok(p) => out.push(p),
            Err(why) => {
                bad += 1;
                first_bad.get_or_insert((i + 1, why));
            }
        }
    }
    if let Some((line, why)) = &first_bad {
        if out.is_empty() {
            return Err(user(
                format!(
                    "{} line {line}: {why}; no line could be plotted",
                    path.display()
                ),
                "each line should be a JSON object as `shardes run` writes it",
            ));
        }
        skipped.push(format!(
            "{}: skipped {bad} unparseable line(s), the first at line {line}: {why}",
            path.display()
        ));
    }
    Ok(out)
}

fn generation(v: &Value) -> Result<f64, String> {
    let obj = v.as_object().ok_or("not a JSON object")?;
    obj.get("generation")
        .and_then(Value::as_f64)
        .filter(|g| g.is_finite())
        .ok_or_else(|| "no numeric `generation`".to_string())
}

fn parse_gen(v: &Value) -> Result<Gen, String> {
    Ok(Gen {
        generation: generation(v)?,
        mean: finite(v.get("fitness_mean")),
        min: finite(v.get("fitness_min")),
        max: finite(v.get("fitness_max")),
        ms: finite(v.get("ms")),
    })
}

fn parse_eval(v: &Value) -> Result<Eval, String> {
    Ok(Eval {
        generation: generation(v)?,
        mean_reward: finite(v.get("mean_reward")),
        accuracy: finite(v.get("accuracy")),
        format_rate: finite(v.get("format_rate")),
    })
}

fn load_run(dir: &Path, name: String) -> Result<Run> {
    if !dir.is_dir() {
        return Err(user(
            format!("run directory {} does not exist", dir.display()),
            "pass the `run.out` directory of a `shardes run` (it holds metrics.jsonl)",
        ));
    }
    let metrics = dir.join("metrics.jsonl");
    if !metrics.is_file() {
        return Err(user(
            format!("{} has no metrics.jsonl", dir.display()),
            "pass the `run.out` directory of a `shardes run`; it writes metrics.jsonl every generation",
        ));
    }
    let empty = std::fs::metadata(&metrics)
        .with_context(|| format!("reading {}", metrics.display()))?
        .len()
        == 0;
    let mut skipped = Vec::new();
    let gens = if empty {
        Vec::new()
    } else {
        read_lines(&metrics, parse_gen, &mut skipped)?
    };
    if gens.is_empty() {
        return Err(user(
            format!("{} is empty", metrics.display()),
            "the run has not finished a generation yet; plot it after the first one",
        ));
    }
    let eval_path = dir.join("eval.jsonl");
    // No eval yet (an empty file) is no eval panel, not an error.
    let evals = match std::fs::metadata(&eval_path) {
        Ok(m) if m.is_file() && m.len() > 0 => read_lines(&eval_path, parse_eval, &mut skipped)?,
        _ => Vec::new(),
    };
    Ok(Run {
        name,
        gens,
        evals,
        skipped,
    })
}

const WIDTH: u32 = 1000;
const PANEL_HEIGHT: u32 = 340;
pub(crate) const FONT: &str = "sans-serif";

/// Distinct, colour-blind friendly (Tableau 10).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// ab_glyph draws only registered fonts: the embedded DejaVu Sans stands in for every family.
pub(crate) fn register_fonts() -> Result<()> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| {
        let mut ok = true;
        for (style, bytes) in [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
        ] {
            for family in [FONT, "serif", "monospace"] {
                ok &= plotters::style::register_font(family, style, bytes).is_ok();
            }
        }
        ok
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded DejaVu Sans font could not be loaded"))
    }
}

fn render(runs: &[Run], path: &Path, format: Format) -> Result<()> {
    register_fonts()?;
    let with_eval = runs.iter().any(|r| !r.evals.is_empty());
    let panels = if with_eval { 3 } else { 2 };
    let size = (WIDTH, PANEL_HEIGHT * panels);
    let bytes = match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
                draw(&root, runs, with_eval)?;
                root.present()
                    .map_err(|e| anyhow!("drawing the plot: {e}"))?;
            }
            svg.into_bytes()
        }
        Format::Png => {
            let mut rgb = vec![0u8; (size.0 * size.1 * 3) as usize];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
                draw(&root, runs, with_eval)?;
                root.present()
                    .map_err(|e| anyhow!("drawing the plot: {e}"))?;
            }
            encode_png(&rgb, size)?
        }
    };
    write_atomic(path, &bytes)
}

fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().context("encoding the PNG")?;
    writer.write_image_data(rgb).context("encoding the PNG")?;
    writer.finish().context("encoding the PNG")?;
    Ok(out)
}

/// A synced temporary sibling renamed over `path`, so a viewer never reads half a plot.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        user(
            format!("{} is not a file name", path.display()),
            "pass e.g. curves.svg",
        )
    })?;
    // The pid keeps `shardes plot` and a running `shardes run` off each other's temporary.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write()
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
        .with_context(|| format!("writing {}", path.display()))
}

/// Splits `(x, y)` at missing `y` into drawable runs of points.
fn segments(points: impl Iterator<Item = (f64, Option<f64>)>) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for (x, y) in points {
        match y {
            Some(y) => current.push((x, y)),
            None if !current.is_empty() => out.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// A padded `[lo, hi]` over the finite values, or `fallback` when there are none.
fn range(values: impl Iterator<Item = f64>, fallback: (f64, f64)) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return fallback;
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.05
    };
    (lo - pad, hi + pad)
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[Run],
    with_eval: bool,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((if with_eval { 3 } else { 2 }, 1));
    let last_gen = runs
        .iter()
        .flat_map(|r| {
            r.gens
                .iter()
                .map(|g| g.generation)
                .chain(r.evals.iter().map(|e| e.generation))
        })
        .fold(0.0f64, f64::max);
    let xs = 0.0..last_gen.max(1.0);
    draw_fitness(&panels[0], runs, xs.clone())?;
    draw_ms(&panels[1], runs, xs.clone())?;
    if with_eval {
        draw_eval(&panels[2], runs, xs)?;
    }
    Ok(())
}

fn chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title: &str,
    xs: std::ops::Range<f64>,
    ys: (f64, f64),
    y_desc: &str,
) -> Result<Chart<'a, DB>> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xs, ys.0..ys.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("generation")
        .x_label_formatter(&|x| {
            // Generations are whole numbers; a short run's axis would otherwise read 1.0, 2.0.
            if (x - x.round()).abs() < 1e-9 {
                format!("{x:.0}")
            } else {
                format!("{x:.1}")
            }
        })
        .y_desc(y_desc)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// How a line is stroked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stroke {
    Solid,
    Dashed,
    Dotted,
}

/// Draws `points` as lines (a dot where a point stands alone); the legend entry goes on the
/// first segment only.
fn draw_line<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    points: Vec<Vec<(f64, f64)>>,
    style: ShapeStyle,
    stroke: Stroke,
    label: Option<String>,
) -> Result<()> {
    let mut label = label;
    for seg in points {
        let anno = if seg.len() == 1 {
            chart
                .draw_series(seg.iter().map(|&p| Circle::new(p, 3, style.filled())))
                .map_err(err)?
        } else if stroke != Stroke::Solid {
            let (on, off) = if stroke == Stroke::Dashed {
                (6, 4)
            } else {
                (2, 4)
            };
            chart
                .draw_series(DashedLineSeries::new(seg, on, off, style))
                .map_err(err)?
        } else {
            chart
                .draw_series(LineSeries::new(seg, style))
                .map_err(err)?
        };
        if let Some(l) = label.take() {
            let s = style.stroke_width(2);
            anno.label(l).legend(move |(x, y)| {
                let dash = match stroke {
                    Stroke::Solid => 20,
                    Stroke::Dashed => 8,
                    Stroke::Dotted => 3,
                };
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (dash, 0)], s)
                    + PathElement::new(vec![(20 - dash, 0), (20, 0)], s)
            });
        }
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FONT, 14))
        .draw()
        .map_err(err)
}

fn draw_fitness<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[Run],
    xs: std::ops::Range<f64>,
) -> Result<()> {
    let ys = range(
        runs.iter().flat_map(|r| {
            r.gens
                .iter()
                .flat_map(|g| [g.mean, g.min, g.max].into_iter().flatten())
        }),
        (0.0, 1.0),
    );
    let mut chart = chart(
        area,
        "fitness per generation (mean, min–max band)",
        xs,
        ys,
        "fitness",
    )?;
    let single = runs.len() == 1;
    for (i, run) in runs.iter().enumerate() {
        let c = color(i);
        let band: Vec<(f64, f64, f64)> = run
            .gens
            .iter()
            .filter_map(|g| Some((g.generation, g.min?, g.max?)))
            .collect();
        if band.len() > 1 {
            let outline: Vec<(f64, f64)> = band
                .iter()
                .map(|&(x, lo, _)| (x, lo))
                .chain(band.iter().rev().map(|&(x, _, hi)| (x, hi)))
                .collect();
            let anno = chart
                .draw_series(std::iter::once(Polygon::new(outline, c.mix(0.18).filled())))
                .map_err(err)?;
            if single {
                anno.label("fitness min–max").legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 20, y + 5)], c.mix(0.18).filled())
                });
            }
        }
        let mean = segments(run.gens.iter().map(|g| (g.generation, g.mean)));
        let label = if single {
            "fitness mean".to_string()
        } else {
            run.name.clone()
        };
        draw_line(
            &mut chart,
            mean,
            c.stroke_width(2),
            Stroke::Solid,
            Some(label),
        )?;
    }
    legend(&mut chart)
}

fn draw_ms<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[Run],
    xs: std::ops::Range<f64>,
) -> Result<()> {
    let (_, hi) = range(
        runs.iter().flat_map(|r| r.gens.iter().filter_map(|g| g.ms)),
        (0.0, 1.0),
    );
    let mut chart = chart(area, "ms / generation", xs, (0.0, hi.max(1e-3)), "ms")?;
    for (i, run) in runs.iter().enumerate() {
        let ms = segments(run.gens.iter().map(|g| (g.generation, g.ms)));
        draw_line(
            &mut chart,
            ms,
            color(i).stroke_width(2),
            Stroke::Solid,
            None,
        )?;
    }
    Ok(())
}

fn draw_eval<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[Run],
    xs: std::ops::Range<f64>,
) -> Result<()> {
    let ys = range(
        runs.iter().flat_map(|r| {
            r.evals.iter().flat_map(|e| {
                [e.mean_reward, e.accuracy, e.format_rate]
                    .into_iter()
                    .flatten()
            })
        }),
        (0.0, 1.0),
    );
    let mut chart = chart(
        area,
        "held-out eval (mean reward solid, accuracy dashed, format rate dotted)",
        xs,
        ys,
        "reward / rate",
    )?;
    let single = runs.len() == 1;
    for (i, run) in runs.iter().enumerate() {
        let c = color(i).stroke_width(2);
        let reward = segments(run.evals.iter().map(|e| (e.generation, e.mean_reward)));
        let acc = segments(run.evals.iter().map(|e| (e.generation, e.accuracy)));
        let format = segments(run.evals.iter().map(|e| (e.generation, e.format_rate)));
        // Several runs: colours are named in the fitness panel's legend; one run: here.
        let name = |s: &str| single.then(|| s.to_string());
        draw_line(&mut chart, reward, c, Stroke::Solid, name("mean reward"))?;
        draw_line(&mut chart, acc, c, Stroke::Dashed, name("accuracy"))?;
        draw_line(&mut chart, format, c, Stroke::Dotted, name("format rate"))?;
    }
    if single {
        legend(&mut chart)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_at_gaps() {
        let pts = [
            (0.0, Some(1.0)),
            (1.0, None),
            (2.0, Some(2.0)),
            (3.0, Some(3.0)),
        ];
        assert_eq!(
            segments(pts.into_iter()),
            vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]
        );
        assert!(segments([(0.0, None)].into_iter()).is_empty());
    }

    #[test]
    fn non_finite_strings_are_gaps() {
        let v: Value = serde_json::from_str(
            r#"{"generation":3,"fitness_mean":"NaN","fitness_min":"-inf","fitness_max":2.5,"ms":null,"extra":1}"#,
        )
        .unwrap();
        let g = parse_gen(&v).unwrap();
        assert_eq!(
            g,
            Gen {
                generation: 3.0,
                mean: None,
                min: None,
                max: Some(2.5),
                ms: None
            }
        );
        assert!(parse_gen(&serde_json::json!([1, 2])).is_err());
        assert!(parse_gen(&serde_json::json!({"fitness_mean": 1.0})).is_err());
    }

    #[test]
    fn range_pads_and_falls_back() {
        assert_eq!(range([2.0, 2.0].into_iter(), (0.0, 1.0)), (1.9, 2.1));
        assert_eq!(range([f64::NAN].into_iter(), (0.0, 1.0)), (0.0, 1.0));
        let (lo, hi) = range([0.0, 10.0].into_iter(), (0.0, 1.0));
        assert!((lo + 0.5).abs() < 1e-12 && (hi - 10.5).abs() < 1e-12);
    }

    #[test]
    fn names_disambiguate_collisions() {
        let dirs = [
            PathBuf::from("a/out"),
            PathBuf::from("b/out"),
            PathBuf::from("c/es"),
        ];
        assert_eq!(run_names(&dirs), vec!["a/out", "b/out", "es"]);
    }
}
