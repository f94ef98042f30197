//! Running the harness's Python, bounded: in its own process group, its standard output and error
//! read line by line (bytes that are not UTF-8 are replaced, never the end of the reading), its
//! progress lines handed on as they come, and at the deadline, or once it has ended, its whole
//! group killed, so that nothing it started (a data loader's workers, a helper process holding
//! the pipes) outlives it or keeps the run waiting.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The prefix of the harness's progress lines on its standard error.
pub(crate) const PROGRESS: &str = "\u{1e}vramplan-progress ";
/// Lines of output kept for an error's message.
const TAIL_LINES: usize = 12;
/// Lines of standard output kept to find the harness's refusal.
const STDOUT_LINES: usize = 64;
/// How long the readers may take to drain the pipes once the process group is gone.
const DRAIN: Duration = Duration::from_secs(2);

/// How a run ended.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The Python's exit status (none when it was killed at the deadline).
    pub status: Option<ExitStatus>,
    /// The deadline came first.
    pub timed_out: bool,
    /// The last lines of standard output.
    pub stdout: Vec<String>,
    /// The last lines of both streams, in the order they came.
    pub tail: Vec<String>,
    /// Seconds it ran.
    pub seconds: f64,
}

/// Runs `command` (whose standard output and error this pipes) until it ends or `deadline`,
/// giving `progress` the rest of each progress line.
pub(crate) fn run_bounded(
    mut command: Command,
    deadline: Instant,
    progress: &mut dyn FnMut(&str),
) -> std::io::Result<Finished> {
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let started = Instant::now();
    let mut child = command.spawn()?;
    let (sender, lines) = mpsc::channel::<(bool, String)>();
    let readers: Vec<_> = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .enumerate()
    .map(|(i, stream)| {
        let sender = sender.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r']).to_string();
                        if sender.send((i == 1, text)).is_err() {
                            break;
                        }
                    }
                }
            }
        })
    })
    .collect();
    drop(sender);
    let mut output = Output::default();
    let mut timed_out = false;
    let status = loop {
        while let Ok((is_err, line)) = lines.try_recv() {
            output.take(is_err, line, progress);
        }
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    kill_group(&mut child);
    // The pipes close once every process of the group is gone; a reader still blocked after that
    // is left behind rather than waited for.
    let drained = Instant::now() + DRAIN;
    while readers.iter().any(|r| !r.is_finished()) && Instant::now() < drained {
        while let Ok((is_err, line)) = lines.try_recv() {
            output.take(is_err, line, progress);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    while let Ok((is_err, line)) = lines.try_recv() {
        output.take(is_err, line, progress);
    }
    Ok(Finished {
        status,
        timed_out,
        stdout: output.stdout.into(),
        tail: output.tail.into(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The lines kept.
#[derive(Default)]
struct Output {
    stdout: VecDeque<String>,
    tail: VecDeque<String>,
}

impl Output {
    fn take(&mut self, is_err: bool, line: String, progress: &mut dyn FnMut(&str)) {
        if let Some(rest) = line.strip_prefix(PROGRESS) {
            progress(rest);
            return;
        }
        if !is_err {
            self.stdout.push_back(line.clone());
            if self.stdout.len() > STDOUT_LINES {
                self.stdout.pop_front();
            }
        }
        self.tail.push_back(line);
        if self.tail.len() > TAIL_LINES {
            self.tail.pop_front();
        }
    }
}

/// Kills the child's process group (all it started), then the child, and reaps it.
fn kill_group(child: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals the process group the child leads (it was
        // made its own group's leader at spawn); it touches no memory of this process.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}
