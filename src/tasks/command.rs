//! A reward computed by a program of the user's, in any language: `[task.reward] command`.
//!
//! # Protocol
//!
//! The program is started once (at the first batch it scores) and kept alive for the run.
//! It reads one JSON object per line on its stdin, one per completion:
//!
//! ```json
//! {"id": 17, "member": 3, "prompt_index": 1, "prompt": "...", "completion": "...",
//!  "item": {"prompt": "...", "answer": "42"}}
//! ```
//!
//! and answers each with one line on its stdout, `{"id": 17, "reward": 0.5}`, flushing
//! after each line. `id` is unique over the run; `member` is the global member index (in
//! a run across processes too), `null` for a held-out evaluation of the unperturbed
//! parameters; `prompt_index` is the prompt's index in the batch; `item` holds the task
//! item's fields ([`super::TaskItem::fields`]). Answers may come in any order: they are
//! matched by `id`. A batch's requests are all written (by a writer thread, so a program
//! that does not read never blocks the run) while the answers are read, so neither pipe
//! fills up and deadlocks.
//!
//! # Failures are contained
//!
//! Like a panicking Rust reward (see the [containment](super#containment) rules), a
//! completion whose answer is bad gets the batch's floor and is listed in
//! [`super::Scores::contained`]:
//! - a reward that is not a finite number (a string, `null`, `1e999`, a value beyond
//!   `f32`): [`Failure::BadAnswer`];
//! - no answer within `timeout` of the previous answer (or of the batch's start):
//!   [`Failure::NoAnswer`]. The timeout is per answer, so a large batch is not cut short
//!   by a program that is slow but steady. Answers that come after their batch gave up on
//!   them have ids no longer asked and are ignored.
//!
//! Lines that are not JSON (without a recoverable `id`), longer than [`MAX_LINE`] bytes,
//! and answers for ids not asked are ignored and counted ([`CommandStats`]); each batch
//! with any of them (or with contained completions) writes one warning line on stderr.
//!
//! # Restarts
//!
//! A program that exits (or closes its stdout) is restarted, at most `restarts` times
//! over the whole run. The completions of the batch it left unanswered are sent once to the
//! new process; if that one dies too before answering them, they are contained and the
//! next batch restarts it again. When a restart is needed and none is left, scoring fails
//! with [`CommandError::Died`], which carries the last [`STDERR_LINES`] lines the program
//! wrote on stderr (a thread drains stderr into a bounded ring, so a program that floods
//! stderr never blocks).
//!
//! # Lifetime
//!
//! The program runs in its own process group (so a Ctrl-C at the terminal reaches the run,
//! which finishes its generation, and not the reward program, which would die mid-batch).
//! Dropping the [`RewardCommand`] kills the group with SIGKILL and reaps the program; a
//! run drops it when it ends, normally, on an error or after a stop signal. A run killed
//! with SIGKILL (or a second Ctrl-C, which exits at once) cannot kill it: the program then
//! sees its stdin close and should exit, as `examples/reward.py` does.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use super::{contain, Failure, Scores};

/// The default of `task.reward.timeout_s`: seconds to wait for each answer.
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;

/// The default of `task.reward.restarts`: restarts allowed over a run.
pub const DEFAULT_RESTARTS: u32 = 3;

/// The longest answer line read, in bytes (1 MiB and some slack); a longer line is
/// discarded as it streams in (never held whole) and counted as a bad line.
pub const MAX_LINE: usize = (1 << 20) + 4096;

/// Lines of the program's stderr kept for an error message.
pub const STDERR_LINES: usize = 20;

/// Longest stderr line kept, in bytes (the rest of the line is dropped).
const STDERR_LINE_MAX: usize = 2000;

/// Answers queued between the reader thread and the scorer. Each is a few bytes (the
/// reader parses the lines), so the queue's memory is bounded whatever the program prints.
const QUEUE: usize = 4096;

/// Errors of a reward program.
#[derive(Debug, Error)]
pub enum CommandError {
    /// `task.reward.command` is empty.
    #[error(
        "task.reward.command is empty; give the program and its arguments, e.g. \
         command = [\"python3\", \"examples/reward.py\"]"
    )]
    Empty,
    /// The program does not exist, is not executable, or could not be started.
    #[error(
        "task.reward.command: cannot start `{program}`: {reason}; check that the program \
         exists and is executable (a name without `/` is looked up on PATH, a path is \
         relative to the directory the run starts in)"
    )]
    Spawn {
        /// The program (the command's first element).
        program: String,
        /// Why not.
        reason: String,
    },
    /// A setting is out of range.
    #[error("task.reward.{key} = {value}: {fix}")]
    Setting {
        /// The key under `[task.reward]`.
        key: &'static str,
        /// Its value.
        value: String,
        /// The accepted range.
        fix: &'static str,
    },
    /// The program stopped and no restart was left.
    #[error(
        "the reward program (task.reward.command = {command}) stopped ({status}) and was \
         already restarted {restarts} times, all that task.reward.restarts allows; {}\
         run it by hand and feed it a request line to see why, or raise task.reward.restarts",
        tail(stderr)
    )]
    Died {
        /// The command, as given.
        command: String,
        /// How it ended (an exit code, a signal, or "closed its stdout").
        status: String,
        /// Restarts used.
        restarts: u32,
        /// Its last lines on stderr, oldest first.
        stderr: Vec<String>,
    },
}

fn tail(lines: &[String]) -> String {
    if lines.is_empty() {
        "it wrote nothing on stderr; ".to_string()
    } else {
        format!("its last lines on stderr:\n  | {}\n", lines.join("\n  | "))
    }
}

/// `[task.reward]`: the program and how patient to be with it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long to wait for each answer.
    pub timeout: Duration,
    /// Restarts allowed over the run.
    pub restarts: u32,
}

impl CommandSpec {
    /// A spec with the default timeout and restarts.
    pub fn new(command: Vec<String>) -> CommandSpec {
        CommandSpec {
            command,
            timeout: Duration::from_secs_f64(DEFAULT_TIMEOUT_S),
            restarts: DEFAULT_RESTARTS,
        }
    }

    /// `timeout_s` as a duration: positive and finite, at most a day.
    pub fn timeout_from_secs(secs: f64) -> Result<Duration, CommandError> {
        if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
            return Err(CommandError::Setting {
                key: "timeout_s",
                value: secs.to_string(),
                fix: "give the seconds to wait for each answer, above 0 and at most 86400",
            });
        }
        Ok(Duration::from_secs_f64(secs))
    }
}

/// One completion to score.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RewardRequest<'a> {
    /// The global member index, `None` (JSON `null`) for a held-out evaluation.
    pub member: Option<usize>,
    /// The prompt's index in the batch.
    pub prompt_index: usize,
    /// The prompt (before any chat template).
    pub prompt: &'a str,
    /// The completion's text.
    pub completion: &'a str,
    /// The item's fields.
    pub item: &'a Value,
}

/// The line sent for a request.
#[derive(Serialize)]
struct Line<'a> {
    id: u64,
    #[serde(flatten)]
    request: &'a RewardRequest<'a>,
}

/// Counts over the run of what the program got wrong (for logs and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandStats {
    /// Processes started (1 + restarts).
    pub starts: u32,
    /// Lines that were not JSON answers (and had no recoverable id) or were too long.
    pub bad_lines: u64,
    /// Answers for ids not asked (or asked by a batch that had given up on them).
    pub stray_answers: u64,
    /// Completions contained because their answer was bad.
    pub bad_answers: u64,
    /// Completions contained because no answer came in time (or the program died twice).
    pub missing_answers: u64,
}

/// What the reader thread hands over.
enum Answer {
    /// An answer (or a line with a recoverable id whose reward is unusable).
    Reward {
        id: u64,
        reward: Result<f32, String>,
    },
    /// A line that is not an answer.
    Bad,
    /// The program closed its stdout.
    Eof,
}

/// A user's reward program (see the [module docs](self)).
pub struct RewardCommand {
    spec: CommandSpec,
    state: Mutex<State>,
}

struct State {
    proc: Option<Proc>,
    /// How the last process ended, with its stderr tail, once one has.
    last_end: Option<(String, Vec<String>)>,
    next_id: u64,
    stats: CommandStats,
}

impl std::fmt::Debug for RewardCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardCommand")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl RewardCommand {
    /// Checks the command (non-empty; its program exists and is executable) without
    /// starting it: the process starts at the first [`RewardCommand::score`].
    pub fn new(spec: CommandSpec) -> Result<RewardCommand, CommandError> {
        let program = spec.command.first().ok_or(CommandError::Empty)?;
        check_program(program)?;
        Ok(RewardCommand {
            spec,
            state: Mutex::new(State {
                proc: None,
                last_end: None,
                next_id: 0,
                stats: CommandStats::default(),
            }),
        })
    }

    /// The spec.
    pub fn spec(&self) -> &CommandSpec {
        &self.spec
    }

    /// The running process's id, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().proc.as_ref().map(|p| p.child.id())
    }

    /// The counts so far.
    pub fn stats(&self) -> CommandStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while scoring leaves counters at worst; the process is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Scores `requests`, in order; failures are contained (see the module docs). Errs
    /// only when the program cannot be (re)started.
    pub fn score(&self, requests: &[RewardRequest<'_>]) -> Result<Scores, CommandError> {
        let mut st = self.lock();
        let before = st.stats;
        let mut results: Vec<Option<Result<f32, Failure>>> = vec![None; requests.len()];
        let mut pending: Vec<usize> = (0..requests.len()).collect();
        let mut resent = false;
        while !pending.is_empty() {
            self.ensure_running(&mut st)?;
            let mut asked: HashMap<u64, usize> = HashMap::with_capacity(pending.len());
            let mut buf = Vec::new();
            for &i in &pending {
                let id = st.next_id;
                st.next_id += 1;
                asked.insert(id, i);
                // Serializing strings and `Value`s cannot fail; a failure would be a bug,
                // contained like a bad answer rather than stopping the run.
                if let Err(e) = serde_json::to_writer(
                    &mut buf,
                    &Line {
                        id,
                        request: &requests[i],
                    },
                ) {
                    results[i] = Some(Err(Failure::BadAnswer(format!("request not sent: {e}"))));
                    asked.remove(&id);
                    continue;
                }
                buf.push(b'\n');
            }
            let timeout = self.spec.timeout;
            let State { proc, stats, .. } = &mut *st;
            let Some(p) = proc.as_mut() else {
                break;
            };
            // A closed channel means the writer met a closed stdin: the reader sees EOF.
            let _ = p.requests.send(buf);
            let died = collect(p, &mut asked, &mut results, stats, timeout);
            pending = asked.into_values().collect();
            pending.sort_unstable();
            if !died {
                for &i in &pending {
                    results[i] = Some(Err(Failure::NoAnswer));
                }
                break;
            }
            if let Some(p) = st.proc.take() {
                let end = p.end();
                st.last_end = Some(end);
            }
            if resent {
                for &i in &pending {
                    results[i] = Some(Err(Failure::NoAnswer));
                }
                break;
            }
            resent = true;
        }
        let results: Vec<Result<f32, Failure>> = results
            .into_iter()
            .map(|r| r.unwrap_or(Err(Failure::NoAnswer)))
            .collect();
        for r in &results {
            match r {
                Err(Failure::NoAnswer) => st.stats.missing_answers += 1,
                Err(Failure::BadAnswer(_)) => st.stats.bad_answers += 1,
                _ => {}
            }
        }
        warn(&self.spec, &before, &st.stats);
        Ok(contain(results))
    }

    /// Starts the process when none runs: the first time, or as a restart while any is
    /// left.
    fn ensure_running(&self, st: &mut State) -> Result<(), CommandError> {
        if st.proc.is_some() {
            return Ok(());
        }
        let restarts = st.stats.starts.saturating_sub(1);
        if st.stats.starts > 0 && restarts >= self.spec.restarts {
            let (status, stderr) = st.last_end.clone().unwrap_or_default();
            return Err(CommandError::Died {
                command: shown(&self.spec.command),
                status,
                restarts,
                stderr,
            });
        }
        st.proc = Some(Proc::spawn(&self.spec.command)?);
        st.stats.starts += 1;
        Ok(())
    }
}

/// One stderr line per batch that had trouble, with the batch's counts.
fn warn(spec: &CommandSpec, before: &CommandStats, now: &CommandStats) {
    let parts: Vec<String> = [
        (
            now.missing_answers - before.missing_answers,
            "without an answer in time",
        ),
        (
            now.bad_answers - before.bad_answers,
            "with a reward that is not a finite number",
        ),
        (
            now.bad_lines - before.bad_lines,
            "lines that are not answers",
        ),
        (
            now.stray_answers - before.stray_answers,
            "answers for ids not asked",
        ),
        (
            u64::from(now.starts.saturating_sub(1) - before.starts.saturating_sub(1)),
            "restarts",
        ),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if !parts.is_empty() {
        // The library's one log line: the run's metrics count the contained completions,
        // but not the lines that were ignored or why.
        eprintln!(
            "warning: reward program {}: {} (contained completions get the batch's floor)",
            shown(&spec.command),
            parts.join(", ")
        );
    }
}

/// Reads answers until every asked id is answered (`false`), or the program ends
/// (`true`), or no answer comes within `timeout` (`false`, ids left in `asked`).
fn collect(
    p: &mut Proc,
    asked: &mut HashMap<u64, usize>,
    results: &mut [Option<Result<f32, Failure>>],
    stats: &mut CommandStats,
    timeout: Duration,
) -> bool {
    let mut deadline = Instant::now() + timeout;
    while !asked.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match p.answers.recv_timeout(left) {
            Ok(Answer::Reward { id, reward }) => match asked.remove(&id) {
                Some(i) => {
                    results[i] = Some(reward.map_err(Failure::BadAnswer));
                    deadline = Instant::now() + timeout;
                }
                None => stats.stray_answers += 1,
            },
            Ok(Answer::Bad) => stats.bad_lines += 1,
            Ok(Answer::Eof) | Err(RecvTimeoutError::Disconnected) => return true,
            Err(RecvTimeoutError::Timeout) => return false,
        }
    }
    false
}

/// The command for messages: its words, quoted as JSON strings.
fn shown(command: &[String]) -> String {
    serde_json::to_string(command).unwrap_or_else(|_| command.join(" "))
}

/// Refuses a program that is not there or not executable (a name without `/` is looked
/// up on `PATH`, as `execvp` would).
fn check_program(program: &str) -> Result<(), CommandError> {
    let bad = |reason: String| CommandError::Spawn {
        program: program.to_string(),
        reason,
    };
    if program.is_empty() {
        return Err(bad("the program name is empty".into()));
    }
    if program.contains('/') {
        return executable(Path::new(program)).map_err(bad);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join(program))
        .any(|p| executable(&p).is_ok());
    if found {
        Ok(())
    } else {
        Err(bad("not found on PATH".into()))
    }
}

fn executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", p.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!(
            "{} is not executable (chmod +x it, or run it through its interpreter, e.g. \
             [\"python3\", \"{}\"])",
            p.display(),
            p.display()
        ));
    }
    Ok(())
}

/// A running program with its threads.
struct Proc {
    child: Child,
    requests: SyncSender<Vec<u8>>,
    answers: Receiver<Answer>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    ended: bool,
}

impl Proc {
    fn spawn(command: &[String]) -> Result<Proc, CommandError> {
        use std::os::unix::process::CommandExt;
        let (program, args) = command.split_first().ok_or(CommandError::Empty)?;
        let mut command = Command::new(program);
        // Killed with the run even when the run cannot end it (SIGKILL).
        crate::runtime::child::end_with_parent(&mut command);
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: see the module docs (Ctrl-C, and the group kill on drop).
            .process_group(0)
            .spawn()
            .map_err(|e| CommandError::Spawn {
                program: program.clone(),
                reason: e.to_string(),
            })?;
        let spawn_err = |what: &str| CommandError::Spawn {
            program: program.clone(),
            reason: format!("no {what} pipe"),
        };
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_err("stdio"));
                }
            };
        // Threads are detached: each ends when its pipe closes (the process dies or is
        // killed) or its channel's other end is dropped.
        let (req_tx, req_rx) = mpsc::sync_channel::<Vec<u8>>(1);
        let writer = std::thread::Builder::new()
            .name("reward-stdin".into())
            .spawn(move || write_requests(stdin, req_rx));
        let (ans_tx, ans_rx) = mpsc::sync_channel::<Answer>(QUEUE);
        let reader = std::thread::Builder::new()
            .name("reward-stdout".into())
            .spawn(move || read_answers(stdout, ans_tx));
        let ring = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_LINES)));
        let ring2 = Arc::clone(&ring);
        let drain = std::thread::Builder::new()
            .name("reward-stderr".into())
            .spawn(move || drain_stderr(stderr, &ring2));
        let mut proc = Proc {
            child,
            requests: req_tx,
            answers: ans_rx,
            stderr: ring,
            stderr_thread: None,
            ended: false,
        };
        match (writer, reader, drain) {
            (Ok(_), Ok(_), Ok(h)) => {
                proc.stderr_thread = Some(h);
                Ok(proc)
            }
            _ => Err(spawn_err("thread for a")),
        }
    }

    /// Kills the process group and reaps the program (after a moment's grace to exit by
    /// itself, since its stdout closed); how it ended and its stderr tail.
    fn end(mut self) -> (String, Vec<String>) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                _ => break,
            }
        }
        let status = self.kill();
        // The stderr thread ends once every holder of the pipe is gone; give it a moment
        // to take in the last lines.
        if let Some(h) = self.stderr_thread.take() {
            let t0 = Instant::now();
            while !h.is_finished() && t0.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let lines = self
            .stderr
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default();
        (status, lines)
    }

    /// Kills the group (once) and reaps the program; how it ended.
    fn kill(&mut self) -> String {
        if self.ended {
            return String::new();
        }
        self.ended = true;
        let exited = match self.child.try_wait() {
            Ok(Some(s)) => Some(s),
            _ => None,
        };
        // Programs it started (a shell's children) are in its group. The leader is not
        // reaped yet, so the group id cannot have been reused. Best effort: the leader is
        // still killed below.
        let _ = crate::runtime::child::kill_group(self.child.id());
        let _ = self.child.kill();
        let status = exited.or_else(|| self.child.wait().ok());
        match status {
            Some(s) if exited.is_some() => describe(s),
            Some(_) => "closed its stdout and was killed".to_string(),
            None => "could not be reaped".to_string(),
        }
    }
}

fn describe(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => s.to_string(),
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn write_requests(mut stdin: ChildStdin, rx: Receiver<Vec<u8>>) {
    for buf in rx {
        if stdin.write_all(&buf).and_then(|()| stdin.flush()).is_err() {
            // The program closed its stdin or died: the reader reports it.
            return;
        }
    }
}

fn read_answers(stdout: impl Read, tx: SyncSender<Answer>) {
    let mut r = BufReader::with_capacity(1 << 16, stdout);
    let mut line = Vec::new();
    loop {
        let answer = match read_line(&mut r, &mut line, MAX_LINE) {
            Ok(Some(true)) => parse_answer(&line),
            Ok(Some(false)) => Answer::Bad,
            Ok(None) | Err(_) => {
                let _ = tx.send(Answer::Eof);
                return;
            }
        };
        if tx.send(answer).is_err() {
            return;
        }
    }
}

fn drain_stderr(stderr: impl Read, ring: &Mutex<VecDeque<String>>) {
    let mut r = BufReader::new(stderr);
    let mut line = Vec::new();
    while let Ok(Some(_)) = read_line(&mut r, &mut line, STDERR_LINE_MAX) {
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        if let Ok(mut q) = ring.lock() {
            if q.len() == STDERR_LINES {
                q.pop_front();
            }
            q.push_back(text);
        }
    }
}

/// Reads one line (without its `\n`) into `line`, keeping at most `max` bytes: `Some(true)`
/// for a whole line, `Some(false)` for one that was longer (the excess is skipped, never
/// stored), `None` at the end of the stream.
fn read_line(
    r: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut whole = true;
    let mut any = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(any.then_some(whole));
        }
        any = true;
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        if whole && line.len() + chunk.len() <= max {
            line.extend_from_slice(chunk);
        } else {
            whole = false;
            line.clear();
        }
        r.consume(used);
        if done {
            return Ok(Some(whole));
        }
    }
}

/// An answer line: `{"id": u64, "reward": finite number}`. A line that is not JSON but
/// names an id (`"id": 12`, as in `{"id": 12, "reward": 1e999}`, which JSON parsers refuse)
/// is a bad reward for that id, so its completion is contained at once rather than after
/// the timeout.
fn parse_answer(line: &[u8]) -> Answer {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return match salvage_id(line) {
                Some(id) => Answer::Reward {
                    id,
                    reward: Err(format!("the answer line is not valid JSON ({e})")),
                },
                None => Answer::Bad,
            }
        }
    };
    let Some(id) = value.get("id").and_then(Value::as_u64) else {
        return Answer::Bad;
    };
    let reward = match value.get("reward") {
        Some(Value::Number(n)) => match n.as_f64().map(|x| x as f32) {
            Some(r) if r.is_finite() => Ok(r),
            _ => Err(format!("reward {n} is not a finite f32")),
        },
        Some(other) => Err(format!(
            "reward {} is not a number",
            short(&other.to_string())
        )),
        None => Err("no \"reward\" key".to_string()),
    };
    Answer::Reward { id, reward }
}

fn short(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The digits after the first `"id"` and `:` of a line, if any.
fn salvage_id(line: &[u8]) -> Option<u64> {
    let at = line.windows(4).position(|w| w == b"\"id\"")? + 4;
    let rest = &line[at..];
    let rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace())?..];
    let rest = rest.strip_prefix(b":")?;
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let digits: &[u8] = &rest[start..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lines() {
        let data = b"short\nthis one is long\n\nlast";
        let mut r = BufReader::with_capacity(3, &data[..]);
        let mut line = Vec::new();
        assert_eq!(read_line(&mut r, &mut line, 8).unwrap(), Some(true));
        assert_eq!(line, b"short");
        assert_eq!(read_line(&mut r, &mut line, 8).unwrap(), Some(false));
        assert!(line.is_empty());
        assert_eq!(read_line(&mut r, &mut line, 8).unwrap(), Some(true));
        assert!(line.is_empty());
        assert_eq!(read_line(&mut r, &mut line, 8).unwrap(), Some(true));
        assert_eq!(line, b"last");
        assert_eq!(read_line(&mut r, &mut line, 8).unwrap(), None);
    }

    #[test]
    fn answers_parse_and_salvage() {
        let ok = |l: &str| match parse_answer(l.as_bytes()) {
            Answer::Reward { id, reward } => Some((id, reward)),
            _ => None,
        };
        assert_eq!(ok(r#"{"id": 3, "reward": 0.5}"#), Some((3, Ok(0.5))));
        assert!(matches!(
            ok(r#"{"id": 3, "reward": 1e999}"#),
            Some((3, Err(_)))
        ));
        assert!(matches!(
            ok(r#"{"id": 4, "reward": 1e39}"#),
            Some((4, Err(_)))
        ));
        assert!(matches!(
            ok(r#"{"id": 5, "reward": "1"}"#),
            Some((5, Err(_)))
        ));
        assert!(matches!(
            ok(r#"{"id": 6, "reward": null}"#),
            Some((6, Err(_)))
        ));
        assert!(ok("garbage").is_none());
        assert!(ok(r#"{"reward": 1}"#).is_none());
        assert_eq!(salvage_id(br#"{"id" :  12, "reward": x}"#), Some(12));
        assert_eq!(salvage_id(br#"{"id": "x"}"#), None);
    }
}
