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
//!
//! The Python runs bounded (`crate::process`); submodules: [`harness`] reads what the harness wrote (and
//! replays its allocations), [`activations`] declares a run's measured activations on a model.

mod activations;
mod harness;

pub use activations::{ActivationsMismatch, MeasuredActivations, declare_measured};

use crate::{Unavailable, process};
use harness::{HarnessRefusal, HarnessResult, rank_run};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::catalog;
use vramplan_sim::trace::Trace;

/// The harness, as shipped: its files and their text (`run_script.py` runs; it imports the
/// others, and `run_plan.py` for the fake mode the torch backend also uses).
const HARNESS: &[(&str, &str)] = &[
    ("run_script.py", include_str!("../../harness/run_script.py")),
    ("script_state.py", include_str!("../../harness/script_state.py")),
    ("script_fake.py", include_str!("../../harness/script_fake.py")),
    ("script_workspace.py", include_str!("../../harness/script_workspace.py")),
    ("script_backward.py", include_str!("../../harness/script_backward.py")),
    ("script_runtime.py", include_str!("../../harness/script_runtime.py")),
    ("run_plan.py", include_str!("../../harness/run_plan.py")),
];

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptRequest {
    /// The user's script.
    pub script: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Optimizer steps to run (or forward passes, where the script makes no optimizer).
    pub steps: u32,
    /// Processes, as `torchrun --nproc-per-node` starts them.
    pub nproc: u32,
    /// Start them as torchrun does (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` … set);
    /// otherwise the one process runs as `python FILE.py` does, with none of them (libraries read
    /// them to choose between one process over all GPUs and one per GPU).
    pub torchrun: bool,
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

impl Location {
    /// The file's name without its folders (`train.py`).
    pub fn file_name(&self) -> &str {
        file_name(&self.file)
    }
}

/// The last part of a path (`train.py` of `/home/me/train.py`), or the whole where it has none.
pub fn file_name(path: &str) -> &str {
    std::path::Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or(path)
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
    /// Of `peak_total_bytes`, the cuBLAS and cuBLASLt workspaces live then, which PyTorch
    /// allocates for matmuls beside the tensors (`harness/script_workspace.py`).
    pub peak_total_workspace_bytes: u64,
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
    /// What happened, in PyTorch's words or the harness's: the deciding rank's message, or what
    /// the ranks do together (two on one GPU, GPUs they fill together).
    pub message: String,
    /// Per GPU: the ranks' figures summed (ranks run at once, each on its GPU).
    pub per_device: Vec<DeviceMemory>,
    /// Every rank.
    pub ranks: Vec<RankRun>,
    /// The library versions the script ran with.
    pub versions: BTreeMap<String, String>,
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
        for (name, text) in HARNESS {
            std::fs::write(dir.join(name), text).map_err(|e| failed(e.to_string()))?;
        }
        write_builtins(&dir).map_err(|e| failed(format!("cannot write the built-in configs: {e}")))?;
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

/// vramplan's built-in models as folders holding their `config.json`, under `dir/builtins/`,
/// and `dir/builtins.json` mapping each model's Hub repository and short name to its folder: a
/// script's `from_pretrained("openai-community/gpt2")` is built from it without the network.
fn write_builtins(dir: &std::path::Path) -> std::io::Result<()> {
    let mut map = BTreeMap::new();
    for (name, repo) in catalog::builtin_entries() {
        let folder = dir.join("builtins").join(name);
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join("config.json"), catalog::builtin_config(name).unwrap_or("{}"))?;
        let folder = folder.display().to_string();
        map.insert(repo.to_string(), folder.clone());
        map.insert(name.to_string(), folder);
    }
    std::fs::write(dir.join("builtins.json"), serde_json::to_string(&map).unwrap_or_default())
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
    let mut all = ScriptValidation {
        outcome: answer.outcome,
        location: answer.location.clone(),
        devices: answer.devices.clone(),
        rank: answer.rank,
        message: answer.message.clone(),
        per_device,
        versions,
        ranks,
    };
    if all.outcome.severity() < ScriptOutcome::Error.severity() {
        together(&mut all);
    }
    all
}

/// What ranks that each completed do together: two on one GPU (the GPU that holds most of each
/// rank's memory), which NCCL refuses ("Duplicate GPU detected") and which shares its memory;
/// or a GPU their bytes fill past its usable memory.
fn together(all: &mut ScriptValidation) {
    let own = |run: &RankRun| {
        run.per_device
            .iter()
            .filter(|d| d.peak_allocated_bytes > 0)
            .max_by_key(|d| d.peak_allocated_bytes)
            .map(|d| d.device)
    };
    for (i, a) in all.ranks.iter().enumerate() {
        for b in &all.ranks[i + 1..] {
            if let (Some(x), Some(y)) = (own(a), own(b))
                && x == y
            {
                all.outcome = ScriptOutcome::Error;
                all.rank = b.rank;
                all.devices = vec![format!("cuda:{x}")];
                all.location = None;
                all.message = format!(
                    "ranks {} and {} both run on GPU {x}: NCCL refuses two ranks on one GPU (\"Duplicate GPU \
                     detected\"), and their memory adds up there; give each rank its own with \
                     torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))",
                    a.rank, b.rank
                );
                return;
            }
        }
    }
    if let Some(d) = all.per_device.iter().find(|d| d.peak_allocated_bytes > d.usable_bytes) {
        all.outcome = ScriptOutcome::OutOfMemory;
        all.devices = vec![format!("cuda:{}", d.device)];
        all.location = d.peak_at.clone();
        all.message = format!(
            "the ranks on GPU {} allocate {} bytes there together against {} usable",
            d.device, d.peak_allocated_bytes, d.usable_bytes
        );
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
        "builtins": dir.join("builtins.json"),
    });
    std::fs::write(&request_path, harness_request.to_string()).map_err(|e| failed(e.to_string()))?;
    let nproc = request.nproc.max(1);
    let mut command = Command::new(python);
    command.arg(dir.join("run_script.py")).arg(&request_path).env("PYTHONUNBUFFERED", "1");
    if request.torchrun {
        command
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500");
    }
    if let Some(folder) = request.script.parent() {
        command.current_dir(folder);
    }
    let finished = process::run_bounded(command, deadline, progress).map_err(|e| failed(e.to_string()))?;
    let last_lines = finished.tail.join("\n");
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
        peak_total_workspace_bytes: 0,
        notes: Vec::new(),
        seconds: finished.seconds,
        activations: None,
        trace: None,
    };
    if finished.timed_out {
        let message = format!(
            "the run passed its time limit of {} s and was stopped (rank {rank}); the script's last lines:\n{last_lines}",
            request.time_limit.as_secs(),
        );
        return Ok((error_run(message), BTreeMap::new()));
    }
    let Ok(text) = std::fs::read_to_string(&result_path) else {
        // The harness refuses on stdout when torch does not import, or real GPUs are missing.
        if let Some(refusal) =
            finished.stdout.iter().rev().find_map(|l| serde_json::from_str::<HarnessRefusal>(l).ok())
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
        let status = finished.status.map_or_else(|| "no status".to_string(), |s| s.to_string());
        let message =
            format!("the Python ended ({status}) without writing its result; its last lines:\n{last_lines}");
        return Ok((error_run(message), BTreeMap::new()));
    };
    let parsed: HarnessResult = match serde_json::from_str(&text) {
        Ok(parsed) => parsed,
        Err(e) => {
            return Ok((error_run(format!("the harness's result does not read: {e}")), BTreeMap::new()));
        }
    };
    match rank_run(parsed, rank, hardware, request.trace_points) {
        Ok((mut run, versions)) => {
            // An error of the script (an exception, a nonzero exit) says what it printed last.
            if run.outcome == ScriptOutcome::Error && !last_lines.is_empty() {
                run.message = format!("{}\nthe script's last lines:\n{last_lines}", run.message);
            }
            Ok((run, versions))
        }
        Err(why) => {
            Ok((error_run(format!("the harness's result does not match the run: {why}")), BTreeMap::new()))
        }
    }
}
