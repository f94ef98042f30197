//! The script validator: a user's own training or inference script run on fake CUDA devices
//! (`vramplan validate --script`). `harness/run_script.py` (embedded in the binary, beside
//! `run_plan.py`, whose fake mode it shares) is written to a temporary folder and runs the script
//! with the user's Python, once per rank as `torchrun --nproc-per-node N` would start it; each
//! run writes one JSON document: how it ended (a device mismatch with its place, an
//! out-of-memory, an error), the peak of live bytes per fake device, and the allocation sequence.
//! Here that sequence is replayed through the simulator's model of PyTorch's caching allocator
//! ([`vramplan_sim::allocator::CachingAllocator`]) for the reserved bytes, to which the device's
//! CUDA context is added for the device-used bytes, as `estimate` counts them.
//!
//! Every run is bounded: the whole of it (all ranks) by the time limit, after which the Python
//! is killed and the answer is an error. A result that does not match the run (a device the
//! profile lacks, a field missing) is an error too, never a pass.

use crate::Unavailable;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::custom::ActivationSizes;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind};
use vramplan_sim::allocator::CachingAllocator;
use vramplan_sim::trace::{Phase, Trace, TraceBuilder};

/// The harness, as shipped.
const HARNESS: &str = include_str!("../harness/run_script.py");
/// The plan harness, whose fake mode the script harness imports.
const PLAN_HARNESS: &str = include_str!("../harness/run_plan.py");
/// The prefix of the harness's progress lines on its standard error.
const PROGRESS: &str = "\u{1e}vramplan-progress ";
/// Lines of the script's own output kept for an error's message.
const TAIL_LINES: usize = 12;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptRequest {
    /// The user's script.
    pub script: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Optimizer steps to run (or forward passes, where the script makes no optimizer).
    pub steps: u32,
    /// Processes, as `torchrun --nproc-per-node` starts them (1: the script alone).
    pub nproc: u32,
    /// The most the whole run (every rank) may take.
    pub time_limit: Duration,
    /// Keep each rank's timeline ([`RankRun::trace`]), at most this many points per GPU.
    pub trace_points: Option<usize>,
    /// Run on this machine's GPUs instead of fake ones (they must be as many as the profile's):
    /// the same stop rule and the same report, with PyTorch's own counters, to check a fake run
    /// against the real one.
    pub real: bool,
}

/// One profile GPU as the harness fakes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct FakeGpu {
    name: String,
    total_bytes: u64,
    usable_bytes: u64,
    capability: [u32; 2],
}

/// How a script run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptOutcome {
    /// The steps ran to the end, with work on the GPUs.
    Completed,
    /// An operation met tensors on two devices.
    DeviceMismatch,
    /// A device's memory ran out.
    OutOfMemory,
    /// The run completed with no work on any GPU while the profile has GPUs.
    GpuIdle,
    /// The script failed otherwise, the harness failed, or the time ran out.
    Error,
}

impl ScriptOutcome {
    /// The outcome's name in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            ScriptOutcome::Completed => "completed",
            ScriptOutcome::DeviceMismatch => "device_mismatch",
            ScriptOutcome::OutOfMemory => "out_of_memory",
            ScriptOutcome::GpuIdle => "gpu_idle",
            ScriptOutcome::Error => "error",
        }
    }

    /// Which outcome is the answer when ranks differ: a mismatch first, then out-of-memory,
    /// an error, an idle GPU, completion.
    fn severity(self) -> u8 {
        match self {
            ScriptOutcome::DeviceMismatch => 4,
            ScriptOutcome::OutOfMemory => 3,
            ScriptOutcome::Error => 2,
            ScriptOutcome::GpuIdle => 1,
            ScriptOutcome::Completed => 0,
        }
    }
}

/// A place in the user's code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    /// The file.
    pub file: String,
    /// The line.
    pub line: u32,
    /// The function (`<module>` at a script's top level).
    pub function: String,
}

/// One fake device's memory over a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceMemory {
    /// The profile's GPU index.
    pub device: u32,
    /// The GPU's name.
    pub name: String,
    /// The peak of live bytes (each storage from creation to death, rounded to 512 bytes).
    pub peak_allocated_bytes: u64,
    /// The peak of the caching allocator's segments for the same allocations.
    pub peak_reserved_bytes: u64,
    /// The peak reserved plus the CUDA context: what `nvidia-smi` would show.
    pub device_used_bytes: u64,
    /// The memory the allocator may use on this GPU.
    pub usable_bytes: u64,
    /// Where allocated bytes peaked (none when nothing was allocated).
    pub peak_at: Option<Location>,
    /// The module running at the peak (empty outside any module).
    pub peak_module: String,
}

/// A device mismatch: the operation and its tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// The operation (`mul`, `index_select`), or the backward node.
    pub operation: String,
    /// The tensors' shapes and devices, in operand order.
    pub shapes: Vec<(Vec<u64>, String)>,
    /// `forward` or `backward`.
    pub phase: String,
}

/// One rank's run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankRun {
    /// The rank (0 without `--nproc`).
    pub rank: u32,
    /// How it ended.
    pub outcome: ScriptOutcome,
    /// Where (a mismatch's operation, the out-of-memory allocation, the error's innermost frame
    /// in the user's code).
    pub location: Option<Location>,
    /// The two devices of a mismatch (`cuda:2`, `cuda:0`), or the device out of memory.
    pub devices: Vec<String>,
    /// A mismatch's operation and tensors.
    pub mismatch: Option<Mismatch>,
    /// The module running then (empty outside any module).
    pub module: String,
    /// The exception's message, or what went wrong.
    pub message: String,
    /// Optimizer steps done.
    pub steps: u32,
    /// Forward passes of top-level modules done.
    pub forwards: u32,
    /// Per GPU of the profile.
    pub per_device: Vec<DeviceMemory>,
    /// The peak of live bytes over all GPUs together (a model split over GPUs holds, at each
    /// moment, the bytes one GPU would hold, less nothing and plus the copies between them).
    pub peak_total_bytes: u64,
    /// Values the script read from tensors that have none (they read 0).
    pub notes: Vec<String>,
    /// Seconds the rank ran.
    pub seconds: f64,
    /// What the first training forward left for backward, per module (none for a run that did
    /// not train).
    #[serde(skip)]
    pub activations: Option<MeasuredActivations>,
    /// The run over time, where [`ScriptRequest::trace_points`] asked for it: every allocation and
    /// free of a GPU is an operation, the phases as the script went through them.
    #[serde(skip)]
    pub trace: Option<Trace>,
}

/// What `validate --script` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScriptValidation {
    /// How the run ended: the first rank with the most severe outcome decides.
    pub outcome: ScriptOutcome,
    /// That rank's location.
    pub location: Option<Location>,
    /// That rank's two devices of a mismatch (or the device out of memory).
    pub devices: Vec<String>,
    /// The rank the answer comes from.
    pub rank: u32,
    /// Per GPU: the ranks' figures summed (ranks run at once, each on its GPU).
    pub per_device: Vec<DeviceMemory>,
    /// Every rank.
    pub ranks: Vec<RankRun>,
    /// The library versions the script ran with.
    pub versions: BTreeMap<String, String>,
}

/// What the first training forward of a run left for backward: per module (its path from the
/// outermost module, `""` for that one), the bytes of GPU storages made while it was the
/// innermost module running and still alive when the forward returned, each module's total
/// with its submodules'; with the batch and sequence length of the forward's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredActivations {
    /// The input's first dimension (none where the forward took no tensor).
    pub batch: Option<u64>,
    /// Its second, where it has one (token ids, or [batch, sequence, features]).
    pub seq: Option<u64>,
    /// Module path → bytes.
    pub modules: BTreeMap<String, u64>,
}

/// What the harness writes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HarnessResult {
    outcome: String,
    message: String,
    location: Option<Location>,
    module: String,
    mismatch: Option<HarnessMismatch>,
    oom: Option<HarnessOom>,
    steps: u32,
    forwards: u32,
    #[allow(dead_code)]
    optimizers: u32,
    #[allow(dead_code)]
    cuda_ops: u64,
    #[allow(dead_code)]
    cpu_ops: u64,
    per_device: Vec<HarnessDevice>,
    peak_total_bytes: u64,
    events: Vec<(u32, u64, u64)>,
    phases: Vec<(usize, String, u8)>,
    activations: Option<MeasuredActivations>,
    notes: Vec<String>,
    versions: BTreeMap<String, String>,
    seconds: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HarnessMismatch {
    operation: String,
    devices: Vec<String>,
    shapes: Vec<(Vec<u64>, String)>,
    module: String,
    location: Option<Location>,
    phase: String,
    message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HarnessOom {
    device: u32,
    location: Option<Location>,
    module: String,
    allocated_bytes: u64,
    usable_bytes: u64,
    requested_bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HarnessDevice {
    device: u32,
    peak_allocated_bytes: u64,
    /// On real GPUs, `max_memory_reserved` (a fake run's comes from the allocator model).
    #[serde(default)]
    peak_reserved_bytes: Option<u64>,
    peak_at: Option<Location>,
    peak_module: String,
    usable_bytes: u64,
}

/// What the harness prints on stdout when it cannot start (no torch).
#[derive(Debug, Deserialize)]
struct HarnessRefusal {
    outcome: String,
    message: String,
    /// For `no_device`: the GPUs the profile has.
    #[serde(default)]
    needed: u32,
    /// For `no_device`: the GPUs this machine has.
    #[serde(default)]
    found: u32,
}

/// Runs `request` on `hardware`'s GPUs as fake CUDA devices, with the Python `python`.
/// `progress` is given each progress line (steps done, the module running) as it comes.
/// `Err` when the Python cannot run the harness at all (missing, or without torch).
pub fn run_script(
    request: &ScriptRequest,
    hardware: &HardwareProfile,
    python: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<ScriptValidation, Unavailable> {
    let failed = |error: String| Unavailable::NoPython { python: python.to_string(), error };
    // The script runs in its own folder: a Python given by a relative path is found from here.
    let resolved = if python.contains(std::path::MAIN_SEPARATOR) {
        std::path::absolute(python).map_err(|e| failed(e.to_string()))?.display().to_string()
    } else {
        python.to_string()
    };
    let python = resolved.as_str();
    let gpus: Vec<FakeGpu> = hardware
        .devices
        .iter()
        .map(|d| FakeGpu {
            name: d.name.clone(),
            total_bytes: d.memory_bytes.saturating_sub(d.driver_reserve_bytes),
            usable_bytes: d.usable_bytes(),
            capability: [d.compute_capability.major, d.compute_capability.minor],
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("vramplan-script-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).map_err(|e| failed(format!("cannot make {}: {e}", dir.display())))?;
    let result = (|| {
        std::fs::write(dir.join("run_script.py"), HARNESS).map_err(|e| failed(e.to_string()))?;
        std::fs::write(dir.join("run_plan.py"), PLAN_HARNESS).map_err(|e| failed(e.to_string()))?;
        let deadline = Instant::now() + request.time_limit;
        let mut ranks = Vec::new();
        let mut versions = BTreeMap::new();
        for rank in 0..request.nproc.max(1) {
            let (run, v) = run_rank(request, &gpus, hardware, &dir, rank, deadline, python, progress)?;
            if versions.is_empty() {
                versions = v;
            }
            ranks.push(run);
        }
        Ok(combine(ranks, hardware, versions))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A number no other run of this process has used.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The answer over all ranks.
fn combine(
    ranks: Vec<RankRun>,
    hardware: &HardwareProfile,
    versions: BTreeMap<String, String>,
) -> ScriptValidation {
    let decisive = ranks
        .iter()
        .enumerate()
        .max_by_key(|(i, r)| (r.outcome.severity(), std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let mut per_device: Vec<DeviceMemory> = Vec::new();
    for run in &ranks {
        for d in &run.per_device {
            match per_device.iter_mut().find(|p| p.device == d.device) {
                Some(p) => {
                    p.peak_allocated_bytes += d.peak_allocated_bytes;
                    p.peak_reserved_bytes += d.peak_reserved_bytes;
                    let context = hardware.devices[d.device as usize].context_reserve_bytes;
                    p.device_used_bytes = p.peak_reserved_bytes + context;
                    if p.peak_at.is_none() {
                        p.peak_at = d.peak_at.clone();
                        p.peak_module = d.peak_module.clone();
                    }
                }
                None => per_device.push(d.clone()),
            }
        }
    }
    let answer = &ranks[decisive];
    ScriptValidation {
        outcome: answer.outcome,
        location: answer.location.clone(),
        devices: answer.devices.clone(),
        rank: answer.rank,
        per_device,
        versions,
        ranks,
    }
}

/// Runs one rank and reads what it wrote.
#[allow(clippy::too_many_arguments)]
fn run_rank(
    request: &ScriptRequest,
    gpus: &[FakeGpu],
    hardware: &HardwareProfile,
    dir: &std::path::Path,
    rank: u32,
    deadline: Instant,
    python: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(RankRun, BTreeMap<String, String>), Unavailable> {
    let failed = |error: String| Unavailable::NoPython { python: python.to_string(), error };
    let result_path = dir.join(format!("result-{rank}.json"));
    let request_path = dir.join(format!("request-{rank}.json"));
    let harness_request = serde_json::json!({
        "script": request.script,
        "args": request.args,
        "steps": request.steps,
        "gpus": gpus,
        "rank": rank,
        "result": result_path,
        "progress": true,
        "real": request.real,
    });
    std::fs::write(&request_path, harness_request.to_string()).map_err(|e| failed(e.to_string()))?;
    let nproc = request.nproc.max(1);
    let mut command = Command::new(python);
    command
        .arg(dir.join("run_script.py"))
        .arg(&request_path)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", nproc.to_string())
        .env("LOCAL_WORLD_SIZE", nproc.to_string())
        .env("GROUP_RANK", "0")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "29500")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(folder) = request.script.parent() {
        command.current_dir(folder);
    }
    let mut child = command.spawn().map_err(|e| failed(e.to_string()))?;
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
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if sender.send((i == 1, line)).is_err() {
                    break;
                }
            }
        })
    })
    .collect();
    drop(sender);
    let started = Instant::now();
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut stdout_lines: Vec<String> = Vec::new();
    let mut timed_out = false;
    let status = loop {
        while let Ok((is_err, line)) = lines.try_recv() {
            if let Some(rest) = line.strip_prefix(PROGRESS) {
                progress(rest);
            } else {
                if !is_err {
                    stdout_lines.push(line.clone());
                    if stdout_lines.len() > 64 {
                        stdout_lines.remove(0);
                    }
                }
                tail.push_back(line);
                if tail.len() > TAIL_LINES {
                    tail.pop_front();
                }
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => return Err(failed(e.to_string())),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for reader in readers {
        let _ = reader.join();
    }
    while let Ok((is_err, line)) = lines.try_recv() {
        if line.starts_with(PROGRESS) {
            continue;
        }
        if !is_err {
            stdout_lines.push(line.clone());
        }
        tail.push_back(line);
        if tail.len() > TAIL_LINES {
            tail.pop_front();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let tail_text: Vec<String> = tail.into_iter().collect();
    let error_run = |message: String| RankRun {
        rank,
        outcome: ScriptOutcome::Error,
        location: None,
        devices: Vec::new(),
        mismatch: None,
        module: String::new(),
        message,
        steps: 0,
        forwards: 0,
        per_device: Vec::new(),
        peak_total_bytes: 0,
        notes: Vec::new(),
        seconds,
        activations: None,
        trace: None,
    };
    if timed_out {
        let message = format!(
            "the run passed its time limit of {} s and was stopped (rank {rank}); the script's last lines:\n{}",
            request.time_limit.as_secs(),
            tail_text.join("\n")
        );
        return Ok((error_run(message), BTreeMap::new()));
    }
    let text = match std::fs::read_to_string(&result_path) {
        Ok(text) => text,
        Err(_) => {
            // The harness refuses on stdout when torch does not import.
            if let Some(refusal) =
                stdout_lines.iter().rev().find_map(|l| serde_json::from_str::<HarnessRefusal>(l).ok())
            {
                match refusal.outcome.as_str() {
                    "missing_library" => {
                        return Err(Unavailable::MissingLibrary {
                            python: python.to_string(),
                            message: refusal.message,
                        });
                    }
                    "no_device" => {
                        return Err(Unavailable::TooFewDevices {
                            needed: (0..refusal.needed).collect(),
                            found: refusal.found,
                        });
                    }
                    _ => {}
                }
            }
            let status = status.map_or_else(|| "no status".to_string(), |s| s.to_string());
            let message = format!(
                "the Python ended ({status}) without writing its result; its last lines:\n{}",
                tail_text.join("\n")
            );
            return Ok((error_run(message), BTreeMap::new()));
        }
    };
    let parsed: HarnessResult = match serde_json::from_str(&text) {
        Ok(parsed) => parsed,
        Err(e) => {
            return Ok((error_run(format!("the harness's result does not read: {e}")), BTreeMap::new()));
        }
    };
    match rank_run(parsed, rank, hardware, request.trace_points) {
        Ok((run, versions)) => Ok((run, versions)),
        Err(why) => {
            Ok((error_run(format!("the harness's result does not match the run: {why}")), BTreeMap::new()))
        }
    }
}

/// A rank's run from what the harness wrote, checked against the profile.
fn rank_run(
    parsed: HarnessResult,
    rank: u32,
    hardware: &HardwareProfile,
    trace_points: Option<usize>,
) -> Result<(RankRun, BTreeMap<String, String>), String> {
    let count = hardware.devices.len();
    if parsed.per_device.len() != count {
        return Err(format!("{} devices reported for a profile of {count}", parsed.per_device.len()));
    }
    let known = |name: &str| -> bool {
        name == "cpu"
            || name == "meta"
            || name.strip_prefix("cuda:").and_then(|i| i.parse::<usize>().ok()).is_some_and(|i| i < count)
    };
    if let Some(e) = parsed.events.iter().find(|e| e.0 as usize >= count) {
        return Err(format!("an allocation on GPU {}, which the profile lacks", e.0));
    }
    let phases = parsed
        .phases
        .iter()
        .map(|(at, name, step)| phase_named(name).map(|p| (*at, p, *step)).ok_or(format!("a phase `{name}`")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut builder = trace_points.map(|points| TraceBuilder::<usize>::new(parsed.events.len(), points));
    let reserved = replay(&parsed.events, hardware, &phases, builder.as_mut());
    let mut per_device = Vec::with_capacity(count);
    for (i, d) in parsed.per_device.into_iter().enumerate() {
        if d.device as usize != i {
            return Err(format!("device {} reported in place {i}", d.device));
        }
        let device = &hardware.devices[i];
        let peak_reserved = d.peak_reserved_bytes.unwrap_or(reserved[i]).max(d.peak_allocated_bytes);
        per_device.push(DeviceMemory {
            device: d.device,
            name: device.name.clone(),
            peak_allocated_bytes: d.peak_allocated_bytes,
            peak_reserved_bytes: peak_reserved,
            device_used_bytes: peak_reserved + device.context_reserve_bytes,
            usable_bytes: d.usable_bytes,
            peak_at: d.peak_at,
            peak_module: d.peak_module,
        });
    }
    let mut run = RankRun {
        rank,
        outcome: ScriptOutcome::Completed,
        location: parsed.location,
        devices: Vec::new(),
        mismatch: None,
        module: parsed.module,
        message: parsed.message,
        steps: parsed.steps,
        forwards: parsed.forwards,
        trace: builder.map(|b| {
            b.finish(
                |_| String::new(),
                |gpu| {
                    let device = &hardware.devices[gpu as usize];
                    (device.name.clone(), device.usable_bytes())
                },
            )
        }),
        per_device,
        peak_total_bytes: parsed.peak_total_bytes,
        notes: parsed.notes,
        seconds: parsed.seconds,
        activations: parsed.activations,
    };
    // A GPU's peak in the timeline is where the harness saw it: its place in the script.
    if let Some(trace) = &mut run.trace {
        let inference = !trace.phases.iter().any(|p| p.phase == Phase::Backward);
        for span in &mut trace.phases {
            if inference && span.phase == Phase::Forward {
                span.phase = Phase::Prefill;
                span.step = 0;
            }
        }
        for device in &mut trace.devices {
            if let Some(d) = run.per_device.iter().find(|d| d.device == device.device) {
                let at = d.peak_at.as_ref().map_or_else(String::new, |l| {
                    let file = std::path::Path::new(&l.file)
                        .file_name()
                        .map_or(l.file.clone(), |f| f.to_string_lossy().into_owned());
                    format!("{file}:{}", l.line)
                });
                device.peak_at =
                    if d.peak_module.is_empty() { at } else { format!("{at} in {}", d.peak_module) };
            }
        }
    }
    match parsed.outcome.as_str() {
        "device_mismatch" => {
            let m = parsed.mismatch.ok_or("a device mismatch without its operation")?;
            if let Some(bad) = m.devices.iter().find(|d| !known(d)) {
                return Err(format!("a mismatch on `{bad}`, a device the profile lacks"));
            }
            run.outcome = ScriptOutcome::DeviceMismatch;
            run.location = m.location;
            run.devices = m.devices;
            run.module = m.module;
            run.message = m.message;
            run.mismatch = Some(Mismatch { operation: m.operation, shapes: m.shapes, phase: m.phase });
        }
        "out_of_memory" => {
            let o = parsed.oom.ok_or("an out-of-memory without its device")?;
            if o.device as usize >= count {
                return Err(format!("out of memory on GPU {}, which the profile lacks", o.device));
            }
            run.outcome = ScriptOutcome::OutOfMemory;
            run.location = o.location;
            run.devices = vec![format!("cuda:{}", o.device)];
            run.module = o.module;
            run.message = format!(
                "{} bytes allocated on GPU {} against {} usable, asking for {} more",
                o.allocated_bytes, o.device, o.usable_bytes, o.requested_bytes
            );
        }
        "gpu_idle" => run.outcome = ScriptOutcome::GpuIdle,
        "error" => run.outcome = ScriptOutcome::Error,
        "completed" => {
            // Segments the allocator model needs past a device's usable memory: the allocations
            // fit, their fragments do not.
            if let Some(d) = run.per_device.iter().find(|d| d.peak_reserved_bytes > d.usable_bytes) {
                run.outcome = ScriptOutcome::OutOfMemory;
                run.devices = vec![format!("cuda:{}", d.device)];
                run.location = d.peak_at.clone();
                run.module = d.peak_module.clone();
                run.message = format!(
                    "the caching allocator would reserve {} bytes on GPU {} against {} usable ({} allocated at \
                     the peak)",
                    d.peak_reserved_bytes, d.device, d.usable_bytes, d.peak_allocated_bytes
                );
            }
        }
        other => return Err(format!("an outcome `{other}` the harness does not write")),
    }
    Ok((run, parsed.versions))
}

/// The phase a harness names.
fn phase_named(name: &str) -> Option<Phase> {
    Some(match name {
        "load" => Phase::Load,
        "forward" => Phase::Forward,
        "loss" => Phase::Loss,
        "backward" => Phase::Backward,
        "optimizer" => Phase::Optimizer,
        _ => return None,
    })
}

/// The peak reserved bytes per GPU of the allocation sequence `events` (device, id, bytes: an
/// allocation, or with 0 bytes the free of `id`), through the caching allocator model; with a
/// `trace`, every event observed in it (allocated and reserved after it) in `phases` (the event
/// each phase begins at).
fn replay(
    events: &[(u32, u64, u64)],
    hardware: &HardwareProfile,
    phases: &[(usize, Phase, u8)],
    mut trace: Option<&mut TraceBuilder<usize>>,
) -> Vec<u64> {
    let mut allocators: Vec<CachingAllocator> =
        hardware.devices.iter().map(|d| CachingAllocator::with_capacity(d.usable_bytes())).collect();
    let mut peaks = vec![0u64; allocators.len()];
    // The harness numbers allocations over all devices; each allocator wants its own compact ids.
    let mut ids: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); allocators.len()];
    let mut next = vec![0u64; allocators.len()];
    let mut marks = phases.iter().peekable();
    for (index, &(device, id, bytes)) in events.iter().enumerate() {
        let d = device as usize;
        if bytes > 0 {
            let local = next[d];
            next[d] += 1;
            ids[d].insert(id, local);
            allocators[d].alloc(local, bytes);
            peaks[d] = peaks[d].max(allocators[d].reserved);
        } else if let Some(local) = ids[d].remove(&id) {
            allocators[d].free(local);
        }
        if let Some(trace) = trace.as_deref_mut() {
            while let Some(&&(at, phase, step)) = marks.peek() {
                if at > index {
                    break;
                }
                trace.phase(index, phase, step);
                marks.next();
            }
            trace.reach(index);
            trace.observe(device, index, allocators[d].allocated, allocators[d].reserved, index);
        }
    }
    peaks
}

/// Why measured activations do not describe a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivationsMismatch {
    /// The run's forward took no tensor with a batch dimension.
    NoBatch,
    /// None of the run's modules is a module of the model: some of each side's names.
    NoCommonModule {
        /// Module paths the run measured.
        measured: Vec<String>,
        /// Module paths the model has.
        model: Vec<String>,
    },
}

/// Declares on `model` the activations a script run measured: every module the run names that
/// the model has and that holds no block takes its bytes as its declaration (`per_token` over the
/// run's batch × sequence, or `per_sample` over its batch where the input had no sequence), so
/// that a block's declaration covers everything inside it, as a declared one does
/// (docs/custom-models.md); containers of blocks are left out, since the memory model would
/// charge their total to their first block again. Returns how many modules took one.
pub fn declare_measured(
    model: &mut ModelDescription,
    measured: &MeasuredActivations,
) -> Result<usize, ActivationsMismatch> {
    let batch = measured.batch.filter(|b| *b > 0).ok_or(ActivationsMismatch::NoBatch)?;
    let per = |bytes: u64| match measured.seq.filter(|s| *s > 0) {
        Some(seq) => ActivationSizes { per_token: bytes.div_ceil(batch * seq), per_sample: 0 },
        None => ActivationSizes { per_token: 0, per_sample: bytes.div_ceil(batch) },
    };
    let mut declared = 0;
    model.root.visit_mut(&mut |module| {
        if module.path.is_empty() || module.children.iter().any(holds_block) {
            return;
        }
        if let Some(bytes) = measured.modules.get(&module.path) {
            module.activations = Some(per(*bytes));
            declared += 1;
        }
    });
    if declared == 0 {
        let mut names = Vec::new();
        model.root.visit(&mut |m| {
            if !m.path.is_empty() && names.len() < 6 {
                names.push(m.path.clone());
            }
        });
        return Err(ActivationsMismatch::NoCommonModule {
            measured: measured.modules.keys().filter(|k| !k.is_empty()).take(6).cloned().collect(),
            model: names,
        });
    }
    Ok(declared)
}

/// Whether `module` is a block or holds one.
fn holds_block(module: &Module) -> bool {
    module.kind == ModuleKind::Block || module.children.iter().any(holds_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t4x2() -> HardwareProfile {
        vramplan_profiles::hardware::load("t4x2").unwrap()
    }

    /// A harness result with `outcome`, over the profile's `gpus`, and `mismatch` devices.
    fn result(outcome: &str, gpus: u32, devices: &[&str], events: Vec<(u32, u64, u64)>) -> HarnessResult {
        HarnessResult {
            outcome: outcome.to_string(),
            message: String::new(),
            location: None,
            module: String::new(),
            mismatch: (outcome == "device_mismatch").then(|| HarnessMismatch {
                operation: "mul".into(),
                devices: devices.iter().map(|d| d.to_string()).collect(),
                shapes: vec![],
                module: String::new(),
                location: Some(Location { file: "train.py".into(), line: 3, function: "<module>".into() }),
                phase: "forward".into(),
                message: String::new(),
            }),
            oom: None,
            steps: 2,
            forwards: 2,
            optimizers: 1,
            cuda_ops: 10,
            cpu_ops: 0,
            per_device: (0..gpus)
                .map(|device| HarnessDevice {
                    device,
                    peak_allocated_bytes: 1024,
                    peak_reserved_bytes: None,
                    peak_at: None,
                    peak_module: String::new(),
                    usable_bytes: 1 << 30,
                })
                .collect(),
            peak_total_bytes: 2048,
            events,
            phases: vec![(0, "load".into(), 0)],
            activations: None,
            notes: vec![],
            versions: BTreeMap::new(),
            seconds: 1.0,
        }
    }

    #[test]
    fn a_result_that_does_not_match_the_profile_is_refused() {
        let hw = t4x2();
        assert!(
            rank_run(result("completed", 3, &[], vec![]), 0, &hw, None).is_err(),
            "three devices for two GPUs"
        );
        let bad = result("device_mismatch", 2, &["cuda:5", "cpu"], vec![]);
        assert!(rank_run(bad, 0, &hw, None).unwrap_err().contains("cuda:5"));
        assert!(
            rank_run(result("completed", 2, &[], vec![(7, 1, 512)]), 0, &hw, None).is_err(),
            "an event on GPU 7"
        );
        assert!(
            rank_run(result("passed", 2, &[], vec![]), 0, &hw, None).is_err(),
            "an outcome the harness never writes"
        );
        let fine =
            rank_run(result("device_mismatch", 2, &["cuda:1", "cpu"], vec![]), 0, &hw, None).unwrap().0;
        assert_eq!(fine.outcome, ScriptOutcome::DeviceMismatch);
        assert_eq!(fine.location.unwrap().line, 3);
    }

    #[test]
    fn reserved_bytes_come_from_the_allocator_model() {
        let hw = t4x2();
        // 2 MiB and 3 MiB on GPU 0: requests over 1 MiB (PyTorch's kSmallSize) and under 10 MiB
        // (kMinLargeAlloc) are carved from 20 MiB segments (kLargeBuffer), so one segment holds
        // both.
        let events = vec![(0, 1, 2 << 20), (0, 2, 3 << 20), (0, 1, 0)];
        let run = rank_run(result("completed", 2, &[], events), 0, &hw, None).unwrap().0;
        assert_eq!(run.per_device[0].peak_reserved_bytes, 20 << 20);
        let context = hw.devices[0].context_reserve_bytes;
        assert_eq!(run.per_device[0].device_used_bytes, (20 << 20) + context);
        assert_eq!(run.per_device[1].peak_reserved_bytes, 1024, "no allocation: the allocated peak stands");
    }

    #[test]
    fn the_most_severe_rank_answers_and_ranks_add_up_per_gpu() {
        let hw = t4x2();
        let ok = rank_run(result("completed", 2, &[], vec![]), 0, &hw, None).unwrap().0;
        let bad =
            rank_run(result("device_mismatch", 2, &["cuda:1", "cuda:0"], vec![]), 1, &hw, None).unwrap().0;
        let all = combine(vec![ok, bad], &hw, BTreeMap::new());
        assert_eq!(all.outcome, ScriptOutcome::DeviceMismatch);
        assert_eq!(all.rank, 1);
        assert_eq!(all.devices, vec!["cuda:1", "cuda:0"]);
        assert_eq!(all.per_device[0].peak_allocated_bytes, 2048, "both ranks' bytes on GPU 0");
    }
}
