//! Textual names of strategies and placements, as written in a config file (shapings have
//! theirs in [`super::shaping::ShapingSpec`]).
//!
//! `"mirrored(lowrank(r=1))"`, `"seed_regenerated(chunk=4)"`, `"iid_gaussian"`,
//! `"lowrank(r=1, coupling=orthogonal_hd)"`: the grammar is `name` or `name(arg, ...)` where
//! an argument is `key=integer`, `key=name` (only `coupling`, see [`super::coupling`]) or a
//! nested strategy (only `mirrored` takes one). Placements are `"A"` and `"B"` ([`How`]). Parsing and
//! [`std::fmt::Display`] round-trip, and serde reads and writes each through them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

use super::coupling::{Coupling, COUPLING_NAMES};

/// The names that [`StrategySpec::from_str`] accepts, for error messages.
pub const STRATEGY_NAMES: &[&str] = &[
    "lowrank(r=R)",
    "seed_regenerated(chunk=C)",
    "iid_gaussian",
    "mirrored(STRATEGY)",
    "and the first three with coupling=gaussian|orthogonal_hd|sobol",
];

/// A perturbation strategy by name and arguments (see the ES spec for what each computes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StrategySpec {
    /// EGGROLL: rank-`r` factored noise on 2-D leaves, never materialized.
    LowRank {
        /// The rank of each member's perturbation.
        r: usize,
    },
    /// Full-rank noise regenerated from seeds, `chunk` members at a time
    /// (`None`: the generation program picks the member chunk).
    SeedRegenerated {
        /// Members evaluated per loop step.
        chunk: Option<usize>,
    },
    /// Full-rank noise materialized for all local members at once.
    IidGaussian,
    /// Antithetic pairs: members `2k` and `2k+1` share direction `k` at `+σ` and `−σ`.
    Mirrored(Box<StrategySpec>),
    /// `inner` (`LowRank`, `SeedRegenerated` or `IidGaussian`) with its Gaussian directions
    /// drawn jointly by `coupling` (never [`Coupling::Gaussian`], which is `inner` itself);
    /// written as `inner`'s last argument, `lowrank(r=1, coupling=orthogonal_hd)`.
    Coupled {
        /// The strategy whose directions are coupled.
        inner: Box<StrategySpec>,
        /// How they are coupled.
        coupling: Coupling,
    },
}

/// A strategy string that does not parse; the message names the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid strategy \"{input}\": {reason} (valid: {})", STRATEGY_NAMES.join(", "))]
pub struct SpecError {
    /// The text that was given, as an [`excerpt`] (at most 60 characters and an ellipsis).
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl StrategySpec {
    /// How many adjacent members share one direction (2 under `Mirrored`, else 1).
    pub fn pairing(&self) -> usize {
        match self {
            StrategySpec::Mirrored(inner) => 2 * inner.pairing(),
            _ => 1,
        }
    }
}

impl fmt::Display for StrategySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StrategySpec::LowRank { r } => write!(f, "lowrank(r={r})"),
            StrategySpec::SeedRegenerated { chunk: Some(c) } => {
                write!(f, "seed_regenerated(chunk={c})")
            }
            StrategySpec::SeedRegenerated { chunk: None } => write!(f, "seed_regenerated"),
            StrategySpec::IidGaussian => write!(f, "iid_gaussian"),
            StrategySpec::Mirrored(inner) => write!(f, "mirrored({inner})"),
            StrategySpec::Coupled { inner, coupling } => {
                f.write_str(&with_coupling(&inner.to_string(), *coupling))
            }
        }
    }
}

impl FromStr for StrategySpec {
    type Err = SpecError;

    fn from_str(input: &str) -> Result<Self, SpecError> {
        let err = |reason: String| SpecError {
            input: excerpt(input),
            reason,
        };
        if input.len() > MAX_SPEC_LEN {
            return Err(err(format!(
                "the strategy is {} bytes long; a strategy has at most {MAX_SPEC_LEN}",
                input.len()
            )));
        }
        let mut p = Parser {
            s: input,
            pos: 0,
            depth: 0,
        };
        let spec = p.strategy().map_err(err)?;
        p.skip_ws();
        if p.pos != p.s.len() {
            return Err(err(format!(
                "unexpected text \"{}\" after the strategy",
                excerpt(&input[p.pos..])
            )));
        }
        Ok(spec)
    }
}

/// A strategy's canonical name with `coupling=NAME` as its last argument:
/// `lowrank(r=1)` → `lowrank(r=1, coupling=sobol)`, `iid_gaussian` →
/// `iid_gaussian(coupling=sobol)`.
pub fn with_coupling(name: &str, coupling: Coupling) -> String {
    match name.strip_suffix(')') {
        Some(head) => format!("{head}, coupling={coupling})"),
        None => format!("{name}(coupling={coupling})"),
    }
}

/// Where the update is contracted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum How {
    /// Gather the weights; every device regenerates and contracts the whole population.
    A,
    /// Each device contracts its own members; one parameter-sized all-reduce (default).
    #[default]
    B,
}

/// What to write instead of an unknown placement.
const HOW_FIX: &str =
    "use \"B\" (contract per device, then all-reduce) or \"A\" (gather weights, contract everywhere)";

/// A placement other than `A` or `B`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement \"{input}\"; {HOW_FIX}")]
pub struct HowError {
    /// The text that was given, as an [`excerpt`].
    pub input: String,
}

impl HowError {
    /// What is wrong: `unknown placement "C"`.
    pub fn message(&self) -> String {
        format!("unknown placement \"{}\"", self.input)
    }

    /// What to write instead.
    pub fn fix(&self) -> &'static str {
        HOW_FIX
    }
}

impl fmt::Display for How {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            How::A => "A",
            How::B => "B",
        })
    }
}

impl FromStr for How {
    type Err = HowError;

    /// `A` or `B`, either case.
    fn from_str(input: &str) -> Result<Self, HowError> {
        match input {
            "A" | "a" => Ok(How::A),
            "B" | "b" => Ok(How::B),
            _ => Err(HowError {
                input: excerpt(input),
            }),
        }
    }
}

/// Deserializes a string through [`FromStr`], the parse error's text as serde's error.
pub(crate) fn deserialize_parsed<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

/// Serde through [`FromStr`] and [`fmt::Display`], as a config file writes the value.
macro_rules! serde_as_text {
    ($t:ty) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                $crate::es::spec::deserialize_parsed(d)
            }
        }

        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}
pub(crate) use serde_as_text;

serde_as_text!(StrategySpec);
serde_as_text!(How);

/// The longest strategy string [`StrategySpec::from_str`] reads, in bytes: every valid
/// strategy is far shorter (`mirrored(seed_regenerated(chunk=1000000))` is 41), and a bound
/// keeps a hostile string from costing time or memory.
pub const MAX_SPEC_LEN: usize = 256;

/// The deepest nesting of parentheses [`StrategySpec::from_str`] follows: only `mirrored`
/// nests, once, so 8 is generous; the bound keeps the recursive parser's stack small.
pub const MAX_SPEC_DEPTH: usize = 8;

/// How many characters of a user's text an error message quotes.
const EXCERPT_CHARS: usize = 60;

/// `text` as an error message quotes it: whole when short, else its first 60 characters and
/// an ellipsis with the total length, so a huge input is not echoed back whole.
pub fn excerpt(text: &str) -> String {
    let count = text.chars().count();
    if count <= EXCERPT_CHARS {
        return text.to_string();
    }
    let head: String = text.chars().take(EXCERPT_CHARS).collect();
    format!("{head}… ({count} characters)")
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
    depth: usize,
}

enum Arg {
    Int(String, usize),
    /// `key=name`.
    Word(String, String),
    Strategy(StrategySpec),
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek().filter(|c| c.is_whitespace()) {
            self.pos += c.len_utf8();
        }
    }

    /// A word: letters (any script, so a misspelt `lörank` is quoted whole), digits and `_`.
    fn ident(&mut self) -> String {
        self.skip_ws();
        let start = self.pos;
        while let Some(c) = self.peek().filter(|c| c.is_alphanumeric() || *c == '_') {
            self.pos += c.len_utf8();
        }
        self.s[start..self.pos].to_lowercase()
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn strategy(&mut self) -> Result<StrategySpec, String> {
        let name = self.ident();
        if name.is_empty() {
            return Err(match self.peek() {
                Some(c) => format!("expected a strategy name, found '{c}'"),
                None => "expected a strategy name".into(),
            });
        }
        let mut args = Vec::new();
        if self.eat('(') {
            self.depth += 1;
            if self.depth > MAX_SPEC_DEPTH {
                return Err(format!(
                    "the strategy nests more than {MAX_SPEC_DEPTH} levels deep (only mirrored \
                     takes a strategy, once)"
                ));
            }
            if !self.eat(')') {
                loop {
                    args.push(self.arg()?);
                    if self.eat(')') {
                        break;
                    }
                    if !self.eat(',') {
                        return Err(format!(
                            "expected ',' or ')' in the arguments of {}",
                            excerpt(&name)
                        ));
                    }
                }
            }
            self.depth -= 1;
        }
        let coupling = take_coupling(&name, &mut args)?;
        let int_arg = |args: &[Arg], key: &str| -> Result<Option<usize>, String> {
            let mut found = None;
            for a in args {
                match a {
                    Arg::Int(k, v) if k == key => {
                        if found.is_some() {
                            return Err(format!(
                                "{name} is given argument {key} twice; give it once"
                            ));
                        }
                        found = Some(*v)
                    }
                    Arg::Word(k, _) if k == key => {
                        return Err(format!("argument {key} needs a non-negative integer"))
                    }
                    Arg::Int(k, _) | Arg::Word(k, _) if key.is_empty() => {
                        return Err(format!(
                            "{name} takes no argument \"{}\" (it takes none)",
                            excerpt(k)
                        ))
                    }
                    Arg::Int(k, _) | Arg::Word(k, _) => {
                        return Err(format!(
                            "{name} takes no argument \"{}\" (it takes {key})",
                            excerpt(k)
                        ))
                    }
                    Arg::Strategy(s) => {
                        return Err(format!("{name} takes no nested strategy (got {s})"))
                    }
                }
            }
            Ok(found)
        };
        let spec = match name.as_str() {
            "lowrank" | "low_rank" | "eggroll" => {
                let r = int_arg(&args, "r")?.unwrap_or(1);
                if r == 0 {
                    return Err("lowrank needs r >= 1".into());
                }
                Ok(StrategySpec::LowRank { r })
            }
            "seed_regenerated" | "seedregenerated" => {
                let chunk = int_arg(&args, "chunk")?;
                if chunk == Some(0) {
                    return Err("seed_regenerated needs chunk >= 1".into());
                }
                Ok(StrategySpec::SeedRegenerated { chunk })
            }
            "iid_gaussian" | "iidgaussian" => {
                int_arg(&args, "")?;
                Ok(StrategySpec::IidGaussian)
            }
            "mirrored" => match args.as_slice() {
                [Arg::Strategy(inner)] => {
                    if matches!(inner, StrategySpec::Mirrored(_)) {
                        return Err("mirrored(mirrored(..)) is not a strategy".into());
                    }
                    Ok(StrategySpec::Mirrored(Box::new(inner.clone())))
                }
                _ => Err("mirrored takes exactly one strategy, e.g. mirrored(lowrank(r=1))".into()),
            },
            other => Err(format!("unknown strategy \"{}\"", excerpt(other))),
        }?;
        couple(spec, coupling)
    }

    fn arg(&mut self) -> Result<Arg, String> {
        let save = self.pos;
        let key = self.ident();
        if self.eat('=') {
            if key.is_empty() {
                return Err("expected an argument name before '='".into());
            }
            self.skip_ws();
            if self.peek().is_some_and(char::is_alphabetic) {
                return Ok(Arg::Word(key, self.ident()));
            }
            let start = self.pos;
            while let Some(c) = self.peek().filter(char::is_ascii_digit) {
                self.pos += c.len_utf8();
            }
            let text = &self.s[start..self.pos];
            if text.is_empty() {
                return Err(format!(
                    "argument {} needs a non-negative integer",
                    excerpt(&key)
                ));
            }
            let v = text.parse::<usize>().map_err(|_| {
                format!(
                    "argument {} = {} is too large (at most {})",
                    excerpt(&key),
                    excerpt(text),
                    usize::MAX
                )
            })?;
            Ok(Arg::Int(key, v))
        } else {
            self.pos = save;
            Ok(Arg::Strategy(self.strategy()?))
        }
    }
}

/// Removes the `coupling=NAME` argument from `args` and parses it (`None` when absent).
fn take_coupling(name: &str, args: &mut Vec<Arg>) -> Result<Option<Coupling>, String> {
    let mut found: Option<Coupling> = None;
    let mut rest = Vec::with_capacity(args.len());
    for a in args.drain(..) {
        match a {
            Arg::Word(k, v) if k == "coupling" => {
                if found.is_some() {
                    return Err(format!(
                        "{name} is given argument coupling twice; give it once"
                    ));
                }
                found = Some(
                    v.parse()
                        .map_err(|e: super::coupling::UnknownCoupling| e.to_string())?,
                );
            }
            Arg::Int(k, _) if k == "coupling" => {
                return Err(format!(
                    "argument coupling needs a name: {}",
                    COUPLING_NAMES.join(", ")
                ))
            }
            other => rest.push(other),
        }
    }
    *args = rest;
    Ok(found)
}

/// `spec` with its directions drawn by `coupling`: refused where the strategy draws no
/// Gaussian directions of its own (`mirrored`: couple its inner strategy) or cannot be
/// coupled that way (`sobol` needs low-rank factors).
fn couple(spec: StrategySpec, coupling: Option<Coupling>) -> Result<StrategySpec, String> {
    let Some(coupling) = coupling else {
        return Ok(spec);
    };
    match &spec {
        StrategySpec::Mirrored(inner) => Err(format!(
            "mirrored takes no coupling; give it to the inner strategy: mirrored({})",
            with_coupling(&inner.to_string(), coupling)
        )),
        StrategySpec::SeedRegenerated { .. } | StrategySpec::IidGaussian
            if coupling.needs_factors() =>
        {
            Err(format!(
                "coupling={coupling} needs low-rank factors, but {spec} draws full-rank noise \
                 (the Sobol direction numbers cover 21,201 dimensions); use \
                 lowrank(r=R, coupling={coupling}), or coupling=orthogonal_hd"
            ))
        }
        _ if coupling == Coupling::Gaussian => Ok(spec),
        _ => Ok(StrategySpec::Coupled {
            inner: Box::new(spec),
            coupling,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that each `(text, needle)`'s text is refused as a strategy, the reason
    /// naming the needle.
    fn assert_refused(cases: &[(&str, &str)]) {
        for (text, needle) in cases {
            let e = text.parse::<StrategySpec>().unwrap_err();
            assert!(e.reason.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn parses_every_documented_form() {
        let cases = [
            ("mirrored(lowrank(r=1))", "mirrored(lowrank(r=1))", 2),
            ("lowrank(r=2)", "lowrank(r=2)", 1),
            ("seed_regenerated(chunk=4)", "seed_regenerated(chunk=4)", 1),
            (
                "mirrored(seed_regenerated)",
                "mirrored(seed_regenerated)",
                2,
            ),
            ("iid_gaussian", "iid_gaussian", 1),
            (" Mirrored( iid_gaussian ) ", "mirrored(iid_gaussian)", 2),
        ];
        for (text, canonical, pairing) in cases {
            let s: StrategySpec = text.parse().unwrap();
            assert_eq!(s.to_string(), canonical);
            assert_eq!(s.pairing(), pairing, "{text}");
            assert_eq!(canonical.parse::<StrategySpec>().unwrap(), s);
        }
    }

    #[test]
    fn rejects_bad_strategies_with_a_reason() {
        for (text, needle) in [
            ("lowrnk(r=1)", "unknown strategy \"lowrnk\""),
            ("lowrank(r=0)", "r >= 1"),
            ("lowrank(k=1)", "no argument \"k\""),
            ("mirrored(mirrored(iid_gaussian))", "not a strategy"),
            ("mirrored()", "exactly one strategy"),
            ("lowrank(r=1) x", "unexpected text"),
            ("lowrank(r=x)", "non-negative integer"),
            // Both found by mutation testing (docs/mutants.md): a missing comma between
            // arguments, and a string that ends inside the arguments.
            ("lowrank(r=1 r=2)", "expected ',' or ')'"),
            ("lowrank(r=1", "expected ',' or ')'"),
            ("", "expected a strategy name"),
        ] {
            let e = text.parse::<StrategySpec>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.contains("valid:"), "{e}");
        }
    }

    /// Parses `text` on a thread with a 256 KiB stack, so a parser that recursed once per
    /// parenthesis would overflow it (and abort the test binary) instead of returning.
    fn parse_on_small_stack(text: String) -> Result<StrategySpec, SpecError> {
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || text.parse::<StrategySpec>())
            .expect("spawning the parser thread")
            .join()
            .expect("the parser thread did not panic")
    }

    #[test]
    fn hostile_nesting_and_length_are_refused_without_recursing() {
        let start = std::time::Instant::now();
        let deep = format!(
            "{}iid_gaussian{}",
            "mirrored(".repeat(30_000),
            ")".repeat(30_000)
        );
        let e = parse_on_small_stack(deep).unwrap_err();
        assert!(e.reason.contains("at most 256"), "{e}");
        assert!(
            e.to_string().len() < 400,
            "the message echoes the input whole: {e}"
        );
        // Under the length bound, the depth bound: nine levels of parentheses.
        let nested = format!("{}lowrank{}", "mirrored(".repeat(9), ")".repeat(9));
        assert!(nested.len() <= MAX_SPEC_LEN);
        let e = parse_on_small_stack(nested).unwrap_err();
        assert!(e.reason.contains("more than 8 levels deep"), "{e}");
        // Unbalanced openers stop at the same bound.
        let e = parse_on_small_stack("lowrank(".repeat(30)).unwrap_err();
        assert!(e.reason.contains("more than 8 levels deep"), "{e}");
        assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
        // Exactly at the length bound a strategy still parses.
        let at_len = format!("lowrank(r=1{})", " ".repeat(MAX_SPEC_LEN - 12));
        assert_eq!(at_len.len(), MAX_SPEC_LEN);
        assert_eq!(at_len.parse(), Ok(StrategySpec::LowRank { r: 1 }));
    }

    #[test]
    fn messages_quote_whole_words_and_at_most_an_excerpt() {
        let e = "lörank(r=1)".parse::<StrategySpec>().unwrap_err();
        assert!(e.reason.contains("unknown strategy \"lörank\""), "{e}");
        let e = "низкий_ранг".parse::<StrategySpec>().unwrap_err();
        assert!(e.reason.contains("\"низкий_ранг\""), "{e}");
        let long = format!("lowrank(r=1) {}", "x".repeat(200));
        let e = long.parse::<StrategySpec>().unwrap_err();
        assert!(e.input.chars().count() < 90, "{}", e.input);
        assert!(e.input.contains("… (213 characters)"), "{}", e.input);
        assert!(e.reason.contains('…'), "{}", e.reason);
        assert_eq!(excerpt("short"), "short");
        let how = "C".repeat(10_000).parse::<How>().unwrap_err();
        assert!(how.message().len() < 120, "{}", how.message());
        let e = "lowrank(r=99999999999999999999999)"
            .parse::<StrategySpec>()
            .unwrap_err();
        assert!(e.reason.contains("is too large"), "{e}");
        assert_refused(&[
            ("lowrank(=3)", "argument name before '='"),
            ("iid_gaussian(=3)", "argument name before '='"),
            (
                "iid_gaussian(k=3)",
                "takes no argument \"k\" (it takes none)",
            ),
            ("lowrank(r=)", "needs a non-negative integer"),
            ("lowrank(r=-1)", "needs a non-negative integer"),
            ("\u{0}", "expected a strategy name, found"),
            ("   ", "expected a strategy name"),
            ("lowrank(r=1,)", "expected a strategy name"),
        ]);
    }

    #[test]
    fn a_repeated_argument_is_refused() {
        assert_refused(&[
            ("lowrank(r=1, r=2)", "lowrank is given argument r twice"),
            ("seed_regenerated(chunk=4,chunk=4)", "argument chunk twice"),
            ("mirrored(lowrank(r=2, r=2))", "argument r twice"),
        ]);
    }

    #[test]
    fn placements_round_trip_in_either_case() {
        for (text, how) in [("A", How::A), ("a", How::A), ("B", How::B), ("b", How::B)] {
            let parsed: How = text.parse().unwrap();
            assert_eq!(parsed, how);
            assert_eq!(parsed.to_string(), text.to_ascii_uppercase());
            assert_eq!(parsed.to_string().parse::<How>().unwrap(), how);
        }
        assert_eq!(How::default(), How::B);
    }

    #[test]
    fn an_unknown_placement_names_itself_and_the_two_choices() {
        let e = "C".parse::<How>().unwrap_err();
        assert_eq!(e.message(), "unknown placement \"C\"");
        assert_eq!(
            e.fix(),
            "use \"B\" (contract per device, then all-reduce) or \"A\" (gather weights, \
             contract everywhere)"
        );
        assert_eq!(e.to_string(), format!("{}; {}", e.message(), e.fix()));
        assert!("".parse::<How>().is_err());
        assert!("AB".parse::<How>().is_err());
    }

    #[test]
    fn serde_reads_and_writes_the_text() {
        let how: How = serde_json::from_str("\"a\"").unwrap();
        assert_eq!(how, How::A);
        assert_eq!(serde_json::to_string(&How::B).unwrap(), "\"B\"");
        let e = serde_json::from_str::<How>("\"C\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown placement \"C\""), "{e}");
        let s: StrategySpec = serde_json::from_str("\" Mirrored(lowrank) \"").unwrap();
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            "\"mirrored(lowrank(r=1))\""
        );
        let e = serde_json::from_str::<StrategySpec>("\"lowrnk\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown strategy \"lowrnk\""), "{e}");
        assert!(serde_json::from_str::<How>("1").is_err());
    }

    #[test]
    fn couplings_parse_round_trip_and_default_to_the_plain_strategy() {
        for (text, canonical) in [
            (
                "lowrank(r=1, coupling=orthogonal_hd)",
                "lowrank(r=1, coupling=orthogonal_hd)",
            ),
            (
                "mirrored(lowrank(coupling=sobol, r=2))",
                "mirrored(lowrank(r=2, coupling=sobol))",
            ),
            (
                "seed_regenerated(coupling=orthogonal_hd)",
                "seed_regenerated(coupling=orthogonal_hd)",
            ),
            (
                "seed_regenerated(chunk=4, coupling=orthogonal_hd)",
                "seed_regenerated(chunk=4, coupling=orthogonal_hd)",
            ),
            (
                "mirrored(iid_gaussian(coupling=ORTHOGONAL_HD))",
                "mirrored(iid_gaussian(coupling=orthogonal_hd))",
            ),
            ("lowrank(r=1, coupling=gaussian)", "lowrank(r=1)"),
            ("iid_gaussian(coupling=gaussian)", "iid_gaussian"),
        ] {
            let s: StrategySpec = text.parse().unwrap();
            assert_eq!(s.to_string(), canonical, "{text}");
            assert_eq!(canonical.parse::<StrategySpec>().unwrap(), s);
        }
        assert_eq!(
            "lowrank(r=1, coupling=gaussian)".parse::<StrategySpec>(),
            Ok(StrategySpec::LowRank { r: 1 })
        );
        let s: StrategySpec = "mirrored(lowrank(r=1, coupling=sobol))".parse().unwrap();
        assert_eq!(s.pairing(), 2);
    }

    #[test]
    fn bad_couplings_are_refused_naming_the_fix() {
        assert_refused(&[
            (
                "seed_regenerated(coupling=sobol)",
                "coupling=sobol needs low-rank factors",
            ),
            (
                "mirrored(iid_gaussian(coupling=sobol))",
                "use lowrank(r=R, coupling=sobol)",
            ),
            ("lowrank(r=1, coupling=sobl)", "unknown coupling \"sobl\""),
            (
                "lowrank(r=1, coupling=sobl)",
                "valid: gaussian, orthogonal_hd, sobol",
            ),
            (
                "lowrank(coupling=sobol, coupling=sobol)",
                "argument coupling twice",
            ),
            ("lowrank(coupling=3)", "coupling needs a name"),
            (
                "mirrored(lowrank(r=1), coupling=orthogonal_hd)",
                "mirrored takes no coupling; give it to the inner strategy: \
                 mirrored(lowrank(r=1, coupling=orthogonal_hd))",
            ),
            ("lowrank(k=sobol)", "takes no argument \"k\""),
            ("iid_gaussian(mode=x)", "takes no argument \"mode\""),
        ]);
    }
}
