//! Why a plan does not fit, and what would make it fit. The shortfall comes from simulating the
//! plainest placement (the layers split evenly over the GPUs): which device runs out, by how
//! many bytes, at which moment of the step. Each remedy is one change a user can make —
//! a smaller batch or sequence, 8-bit or 4-bit weights, gradient checkpointing, LoRA instead of
//! a full fine-tune, more GPUs of the profile's kind, layers offloaded to the CPU — and each is
//! verified by solving again with the change; only changes that fit are offered.
//!
//! Shortfalls and remedies are data (a device as a [`Target`] and its name, a change as a
//! [`Change`]); `vramplan-reports` puts them in words and flags.
//!
//! # Probes
//!
//! A remedy is searched by *probes*, each the change at one value (a batch, a sequence length,
//! a count of GPUs), with the boundary search of [`crate::whatif`]. A probe answers in three
//! steps, cheapest first, and what each found is kept, so no value is probed twice:
//!
//! 1. bytes alone: the problem is built (no solve) and checked against the two relaxations
//!    whose infeasibility is the plan's proof of "does not fit" (each unit at its floor; each
//!    unit's steady holdings, see [`crate::plan`]): a unit that no GPU can hold even alone, or
//!    more bytes that must stay on GPUs than they have room for once each reserves the
//!    workspace of the units it runs (`no_placement`). Such a probe does not fit, proven as
//!    the plan would prove it, with no solve. Before a search these bounds alone bisect its
//!    range, so its solves start at the largest value (the fewest GPUs) bytes leave open;
//! 2. where the request allows `cpu` and `disk`, the plan without them: one that fits is a
//!    plan of the request as well, with the least offload (none), and on a chain of layers
//!    the partition answers it in milliseconds where the ILP with offload may take seconds;
//! 3. the plan as asked.
//!
//! # Budget
//!
//! All probes share one deadline: `Settings::time_limit_s`, or [`DEFAULT_BUDGET_S`] without
//! one (the command line passes that budget, or what is left of `--time-limit` where less). A first round searches
//! every remedy with steps 1 and 2 (step 2 is the plan as asked where there is no `cpu` or
//! `disk`); a second round searches again, with step 3, the remedies the first left
//! undecided: a batch or sequence up from the one found (from the smallest when none was),
//! more GPUs below the count found. In each round every remedy in turn gets an equal share of
//! the time left (what one leaves unused goes to those after it), and no solve gets more than
//! its remedy's share, the deadline or [`PROBE_SECONDS`]. Once a remedy's share is spent its
//! search probes nothing new (what is known still answers); the bounds of step 1, a build of
//! the problem each and no solve, still bisect each remedy's range whatever its share. At the
//! deadline everything stops, bounds included: a build may take seconds at the largest sizes.
//!
//! A probe left without an answer (out of time, or neither fitting nor proven not to) is
//! undecided: a remedy with such a probe and no answer is listed in
//! [`Explanation::undecided`], never as one that does not fit, and a batch or sequence found
//! below an undecided one says so (`larger_undecided`, `longer_undecided`).
//! [`Explanation::effort`] counts probes, bounds, solves and time-outs.
//!
//! Explanations follow a proven infeasibility only.

use crate::Target;
use crate::build::{self, Request};
use crate::plan::{Plan, Settings, Unanswered, Verdict, deadline_after, plan, seconds_left};
use crate::problem::Problem;
use crate::runtime::Runtime;
use crate::whatif::{search, with_quant};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::placement::Placement;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Workload};

/// The most GPUs a "more GPUs" remedy looks for.
const MAX_GPUS: u32 = 64;

/// The longest one probe's solve may take, in seconds.
pub const PROBE_SECONDS: f64 = 5.0;

/// The seconds all probes share when the command has no time limit: with the rest of the
/// command, a "does not fit" answer comes with its remedies within a second. A debug build (the
/// test suite, with the workspace crates unoptimised) builds and simulates about seven times
/// slower, and gets twenty times the time, so that it decides what a release build decides.
pub const DEFAULT_BUDGET_S: f64 = if cfg!(debug_assertions) { 10.0 } else { 0.5 };

/// Bytes the bytes-only bounds give the benefit of the doubt per device: the ILP's rows hold
/// within HiGHS's feasibility tolerance (10⁻⁷ of a device's size, kilobytes), so a relaxation
/// over by less than this may not be proven infeasible by the plan either.
const BOUND_SLACK_BYTES: u64 = 1 << 20;

/// The LoRA rank a remedy proposes in place of a full fine-tune (alpha 32, the default targets).
pub const LORA_RANK: u64 = 16;

/// The sequence lengths a "shorter sequence" remedy tries: multiples of this.
pub const SEQ_STEP: u64 = 128;

/// A device that runs out, in the even split.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shortfall {
    /// The device (`GPU 0`).
    pub device: Target,
    /// Its name in the hardware profile (`Tesla T4`).
    pub name: String,
    /// Bytes beyond the limit (usable × (1 − headroom)).
    pub short_bytes: u64,
    /// The moment of the step the peak happens (`backward of model.layers.0 (step 2)`).
    pub at: String,
}

/// The bitsandbytes quantizations a remedy proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bitsandbytes {
    /// LLM.int8 weights (`--quant int8`).
    Int8,
    /// 4-bit NF4 weights with double quantization (`--quant nf4 --double-quant`).
    Nf4DoubleQuant,
}

impl Bitsandbytes {
    /// The workload's quantization.
    pub fn quant(self) -> Quant {
        match self {
            Bitsandbytes::Int8 => Quant::Int8,
            Bitsandbytes::Nf4DoubleQuant => Quant::Nf4 { double_quant: true },
        }
    }
}

/// bitsandbytes weights, as one remedy or as part of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Quantization {
    /// The quantization.
    pub quant: Bitsandbytes,
    /// The LoRA rank that replaces a full fine-tune (bitsandbytes weights cannot be fully
    /// fine-tuned: quantized training is QLoRA); `None` when the workload's fine-tuning stays.
    pub lora_rank: Option<u64>,
}

/// One change to the user's input, as data. In a [`Remedy`] it was verified to fit; in
/// [`Explanation::undecided`] its probes ran out of time, and what they were looking for and
/// did not find (the largest batch, the number of GPUs) is `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// A smaller batch (`--batch`).
    Batch {
        /// The largest batch found to fit; `None` when none was found.
        batch: Option<u64>,
        /// Larger batches were left undecided by the time limit: `batch` fits, but need not be
        /// the largest that does. False when `batch` is `None`.
        larger_undecided: bool,
    },
    /// A shorter sequence, a multiple of [`SEQ_STEP`] (`--seq`; a prompt longer than it is
    /// shortened to it).
    Sequence {
        /// The longest sequence found to fit; `None` when none was found.
        seq: Option<u64>,
        /// Longer sequences were left undecided by the time limit: `seq` fits, but need not be
        /// the longest that does. False when `seq` is `None`.
        longer_undecided: bool,
    },
    /// Gradient checkpointing per decoder layer (`--grad-ckpt full`).
    GradCheckpointing,
    /// LoRA instead of a full fine-tune (`--lora-rank`).
    Lora {
        /// The rank ([`LORA_RANK`]).
        rank: u64,
    },
    /// bitsandbytes weights (`--quant`), with LoRA where the workload was a full fine-tune.
    Quantize(Quantization),
    /// Less of each GPU kept free (`--headroom`): the step fits the GPUs' usable memory, but
    /// not within the headroom asked for.
    Headroom {
        /// The largest headroom that fits, in whole percent.
        percent: u32,
    },
    /// Modules offloaded to the CPU, for inference under accelerate (leaving out
    /// `--no-offload`); slower, since their weights cross PCIe every step.
    Offload {
        /// How many `device_map` entries the plan found puts off the GPUs; `None` when no plan
        /// was found.
        modules: Option<usize>,
    },
    /// More GPUs of the profile's first GPU's kind (`--hardware`), alone or with bitsandbytes
    /// weights.
    MoreGpus {
        /// The fewest GPUs found to fit; `None` when no count was found.
        gpus: Option<u32>,
        /// How many more than the profile has (`gpus` less the profile's count).
        added: Option<u32>,
        /// The GPU's name (`Tesla T4`).
        kind: String,
        /// The hardware short form that gives them (`8xt4`, for `--hardware`).
        hardware: Option<String>,
        /// The quantization it goes with, if any.
        quantize: Option<Quantization>,
    },
}

/// A change that makes the plan fit, verified by re-solving.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remedy {
    /// The change.
    pub change: Change,
    /// The re-solved plan's largest GPU utilisation (peak reserved / usable).
    pub utilisation: f64,
}

/// Why it does not fit and what would.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The devices that run out when the layers are split evenly (none: the split fits
    /// everywhere, yet no placement keeps every device within its limit).
    pub shortfalls: Vec<Shortfall>,
    /// Changes that fit, each verified by solving again.
    pub remedies: Vec<Remedy>,
    /// Changes whose checks ran out of time: they may or may not fit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub undecided: Vec<Change>,
    /// What the search did (not serialized: it depends on the time each solve took).
    #[serde(skip)]
    pub effort: Effort,
}

/// What the remedy search did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effort {
    /// Probes made: each change at one value, once.
    pub probes: u32,
    /// Probes decided by bytes alone, with no solve.
    pub by_bytes: u32,
    /// Plans solved (a probe may solve twice: without offload, then as asked).
    pub solves: u32,
    /// Solves wanted but not run, or cut short, for want of time.
    pub out_of_time: u32,
    /// Values a search would have probed, left undecided because no time was left.
    pub skipped: u32,
}

/// Explains an infeasible request within `settings.time_limit_s`, or [`DEFAULT_BUDGET_S`]
/// without one (see the module documentation, "Budget").
pub fn explain(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Explanation {
    let budget = settings.time_limit_s.filter(|s| !s.is_nan()).unwrap_or(DEFAULT_BUDGET_S);
    let deadline = deadline_after(Some(budget));
    // The even split's replay is skipped, like every solve, once the time is up.
    let out_of_time = seconds_left(deadline).is_some_and(|s| s <= 0.0);
    let shortfalls = if out_of_time { Vec::new() } else { shortfalls(model, hardware, workload, request) };
    let probes = Probes::new(model, *settings, deadline);
    let (remedies, undecided) = remedies(hardware, workload, request, &probes);
    Explanation { shortfalls, remedies, undecided, effort: probes.effort.get() }
}

fn shortfalls(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Vec<Shortfall> {
    let gpus = hardware.devices.len() as u32;
    let placement = if gpus > 1 { Placement::even_layers(model, gpus) } else { Placement::single(0) };
    let replayed =
        vramplan_sim::estimate::estimate_within(model, hardware, workload, &placement, request.headroom);
    let Ok(estimate) = replayed else {
        return Vec::new();
    };
    estimate
        .devices
        .iter()
        .filter_map(|d| {
            let limit = vramplan_sim::estimate::limit_bytes(d.usable_bytes, request.headroom);
            (d.peak_reserved_bytes > limit).then(|| Shortfall {
                device: Target::Gpu(d.id),
                name: d.name.clone(),
                short_bytes: d.peak_reserved_bytes - limit,
                at: d.peak_at.clone(),
            })
        })
        .collect()
}

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Probe {
    /// It fits: the plan's largest GPU utilisation, and its `device_map` entries off the GPUs.
    Fits {
        utilisation: f64,
        off_gpus: usize,
    },
    DoesNotFit,
    /// Not decided: out of time, not proven either way, or not buildable.
    Unknown,
}

impl Probe {
    /// The largest GPU utilisation when it fits.
    fn utilisation(self) -> Option<f64> {
        match self {
            Probe::Fits { utilisation, .. } => Some(utilisation),
            Probe::DoesNotFit | Probe::Unknown => None,
        }
    }
}

/// A probe: a remedy and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Batch(u64),
    /// The sequence length in steps of [`SEQ_STEP`].
    Sequence(u64),
    GradCheckpointing,
    Lora,
    Quantize(usize),
    Offload,
    /// A headroom, in whole percent.
    Headroom(u32),
    /// A more-GPUs candidate (its index) at a count.
    MoreGpus(usize, u32),
}

/// How far a probe got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Bytes alone leave it open; nothing solved yet.
    Open,
    /// The quick solve (without offload) did not decide it; the plan as asked may.
    Quick,
    /// Decided, or given its one chance with the time there was.
    Settled,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    probe: Probe,
    stage: Stage,
    /// The problem has `cpu` or `disk` (the request allows offload and the target uses it).
    hosts: bool,
}

/// The probes' shared settings, deadline and answers.
struct Probes<'a> {
    model: &'a ModelDescription,
    settings: Settings,
    /// When every solve stops.
    deadline: Option<Instant>,
    /// When the bytes-only bounds stop: the deadline (the tests lift it to check what bytes
    /// alone decide).
    bounds_until: Option<Instant>,
    /// When the current remedy's share of the time ends.
    share: Cell<Option<Instant>>,
    /// Whether probes may run the plan as asked (the second round) or only the quick steps.
    thorough: Cell<bool>,
    known: RefCell<BTreeMap<Key, Known>>,
    /// Some probe since the last [`Probes::take_undecided`] ended undecided.
    undecided: Cell<bool>,
    effort: Cell<Effort>,
}

impl<'a> Probes<'a> {
    fn new(model: &'a ModelDescription, settings: Settings, deadline: Option<Instant>) -> Probes<'a> {
        Probes {
            model,
            settings,
            deadline,
            bounds_until: deadline,
            share: Cell::new(deadline),
            thorough: Cell::new(false),
            known: RefCell::new(BTreeMap::new()),
            undecided: Cell::new(false),
            effort: Cell::new(Effort::default()),
        }
    }

    fn count(&self, f: impl FnOnce(&mut Effort)) {
        let mut effort = self.effort.get();
        f(&mut effort);
        self.effort.set(effort);
    }

    /// Gives the next remedy an equal share of the time left among `remedies` still to search.
    fn share_among(&self, remedies: usize) {
        let share = seconds_left(self.deadline).map(|left| left / remedies.max(1) as f64);
        self.share.set(share.and_then(|s| Instant::now().checked_add(Duration::from_secs_f64(s))));
    }

    /// Whether bytes alone leave the change open (step 1 only); open, unchecked, once the time
    /// is up.
    fn open(&self, key: Key, hardware: &HardwareProfile, workload: &Workload, request: &Request) -> bool {
        let known = self.known.borrow().get(&key).copied();
        let known = match known {
            Some(known) => known,
            None if seconds_left(self.bounds_until).is_some_and(|s| s <= 0.0) => {
                self.count(|e| e.skipped += 1);
                return true;
            }
            None => self.bound(key, hardware, workload, request),
        };
        known.probe != Probe::DoesNotFit
    }

    /// The probe of the change: as far as this round goes (see the module documentation).
    fn probe(&self, key: Key, hardware: &HardwareProfile, workload: &Workload, request: &Request) -> Probe {
        let known = self.known.borrow().get(&key).copied();
        let mut known = match known {
            Some(known) => known,
            // Out of time a search goes on with what is known, probing nothing new.
            None if self.seconds() <= 0.0 => {
                self.count(|e| e.skipped += 1);
                self.undecided.set(true);
                return Probe::Unknown;
            }
            None => self.bound(key, hardware, workload, request),
        };
        if known.stage == Stage::Open {
            known = self.quick(key, known, hardware, workload, request);
        }
        if known.stage == Stage::Quick && self.thorough.get() {
            known = self.as_asked(known, hardware, workload, request);
        }
        self.known.borrow_mut().insert(key, known);
        if known.probe == Probe::Unknown {
            self.undecided.set(true);
        }
        known.probe
    }

    /// Step 1: builds the problem and checks it against the bytes-only bounds.
    fn bound(&self, key: Key, hardware: &HardwareProfile, workload: &Workload, request: &Request) -> Known {
        self.count(|e| e.probes += 1);
        let mut known = Known { probe: Probe::Unknown, stage: Stage::Open, hosts: false };
        // Data parallelism places nothing: its plan is the replay of each rank.
        if !vramplan_sim::estimate::is_data_parallel(workload) {
            match build::build(self.model, hardware, workload, request) {
                // The plan would refuse it the same way: nothing to offer.
                Err(_) => known.stage = Stage::Settled,
                Ok(built) if no_placement(&built.problem) => {
                    self.count(|e| e.by_bytes += 1);
                    known = Known { probe: Probe::DoesNotFit, stage: Stage::Settled, hosts: false };
                }
                Ok(built) => {
                    known.hosts = built.problem.devices.iter().any(|d| !matches!(d.tier, Target::Gpu(_)))
                }
            }
        }
        self.known.borrow_mut().insert(key, known);
        known
    }

    /// Step 2: where `cpu` and `disk` are allowed, the plan without them (a fit is final);
    /// otherwise the plan as asked (final unless it ran out of time).
    fn quick(
        &self,
        key: Key,
        known: Known,
        hardware: &HardwareProfile,
        workload: &Workload,
        request: &Request,
    ) -> Known {
        if !known.hosts {
            let (probe, timed_out) = self.solve(hardware, workload, request);
            let stage = if timed_out { Stage::Quick } else { Stage::Settled };
            return Known { probe, stage, ..known };
        }
        // The offload remedy's plan without offload is the request that was just proven not
        // to fit.
        if key == Key::Offload {
            return Known { stage: Stage::Quick, ..known };
        }
        let on_gpus = Request { offload: false, ..request.clone() };
        match self.solve(hardware, workload, &on_gpus).0 {
            fits @ Probe::Fits { .. } => Known { probe: fits, stage: Stage::Settled, ..known },
            Probe::DoesNotFit | Probe::Unknown => {
                Known { probe: Probe::Unknown, stage: Stage::Quick, ..known }
            }
        }
    }

    /// Step 3: the plan as asked, with the remedy's share of the time. Settled unless it got no
    /// time at all (a later remedy's share may give it some).
    fn as_asked(
        &self,
        known: Known,
        hardware: &HardwareProfile,
        workload: &Workload,
        request: &Request,
    ) -> Known {
        if self.seconds() <= 0.0 {
            self.count(|e| e.out_of_time += 1);
            return known;
        }
        let (probe, _) = self.solve(hardware, workload, request);
        Known { probe, stage: Stage::Settled, ..known }
    }

    /// Seconds a solve may take now: the remedy's share and the deadline, at most
    /// [`PROBE_SECONDS`].
    fn seconds(&self) -> f64 {
        let share = seconds_left(self.share.get());
        let all = seconds_left(self.deadline);
        [share, all].into_iter().flatten().fold(PROBE_SECONDS, f64::min)
    }

    /// Plans with the change within [`Probes::seconds`]: what it found, and whether the time
    /// ran out before an answer.
    fn solve(&self, hardware: &HardwareProfile, workload: &Workload, request: &Request) -> (Probe, bool) {
        let left = self.seconds();
        if left <= 0.0 {
            self.count(|e| e.out_of_time += 1);
            return (Probe::Unknown, true);
        }
        self.count(|e| e.solves += 1);
        let settings = Settings { time_limit_s: Some(left), ..self.settings };
        let Ok(found) = plan(self.model, hardware, workload, request, &settings) else {
            return (Probe::Unknown, false);
        };
        match found.verdict {
            Verdict::Fits => {
                let utilisation = largest_utilisation(&found);
                let off_gpus = found.device_map.iter().filter(|(_, t)| !matches!(t, Target::Gpu(_))).count();
                (Probe::Fits { utilisation, off_gpus }, false)
            }
            Verdict::DoesNotFit => (Probe::DoesNotFit, false),
            Verdict::Unknown => {
                let timed_out = found.unanswered == Some(Unanswered::TimeLimit);
                if timed_out {
                    self.count(|e| e.out_of_time += 1);
                }
                (Probe::Unknown, timed_out)
            }
        }
    }

    /// What the probe of `key` found so far.
    fn found(&self, key: Key) -> Option<Probe> {
        self.known.borrow().get(&key).map(|k| k.probe)
    }

    /// Whether a probe since the last call ended undecided; resets the flag.
    fn take_undecided(&self) -> bool {
        self.undecided.replace(false)
    }
}

fn largest_utilisation(plan: &Plan) -> f64 {
    plan.devices.iter().filter(|d| d.estimate.is_some()).map(|d| d.utilisation).fold(0.0, f64::max)
}

/// What one unit needs in a relaxation of the step: `lasting` bytes on a GPU wherever it is
/// (its KV cache: an offloaded unit leaves it on the GPU that runs it), `resident` bytes where
/// it is placed, and `work` bytes of workspace on the GPU that runs it.
#[derive(Debug, Clone, Copy)]
struct Need {
    copies: u64,
    lasting: u64,
    resident: u64,
    work: u64,
    offloadable: bool,
}

/// Whether bytes alone prove that no placement fits: one of the two relaxations the plan
/// solves to prove "does not fit" (each unit at its floor, at one moment shared by all; each
/// unit's steady holdings, with its running bytes while it runs) has no placement, by
/// [`relaxation_fails`]. Infeasible there is infeasible for the plan's own charges, which are
/// larger, and no replay fits either: the plan would say "does not fit", proven. Pins, groups
/// and order are left out, which only loosens the bounds.
fn no_placement(problem: &Problem) -> bool {
    let floors: Vec<Need> = problem
        .units
        .iter()
        .map(|u| Need {
            copies: u64::from(u.count),
            lasting: 0,
            resident: u.floor_bytes,
            work: 0,
            offloadable: !u.gpu_only,
        })
        .collect();
    let steady: Vec<Need> = problem
        .units
        .iter()
        .map(|u| {
            let s = u.steady;
            Need {
                copies: u64::from(u.count),
                lasting: s.throughout_bytes.saturating_sub(s.resident_bytes),
                resident: s.resident_bytes,
                work: s.running_bytes.saturating_sub(s.throughout_bytes),
                offloadable: !u.gpu_only,
            }
        })
        .collect();
    relaxation_fails(problem, &floors) || relaxation_fails(problem, &steady)
}

/// Whether `needs` (one per unit of `problem`) fit no placement on `problem`'s devices, as the
/// ILP charges a device (module documentation of `ilp`): a GPU holds its units' lasting and
/// resident bytes and the largest workspace among them; `cpu` and `disk` take resident bytes
/// of units that are not GPU-only, and where their units run on a GPU (accelerate), that GPU
/// holds their lasting bytes and, as workspace, a copy's resident bytes with its work. Two
/// checks, each a bound every placement meets:
///
/// - each unit alone: some GPU, or offloaded its running GPU, has room for all of it;
/// - at each workspace size θ, the units whose work is at least θ: every GPU holding one
///   reserves θ or more, so their bytes on GPUs fit in `Σ (capacity − θ)`; offloading takes
///   resident bytes off the GPUs, at most what a fractional knapsack puts on the running GPU
///   (lasting bytes within its capacity less the smallest workspace an offloaded one brings).
fn relaxation_fails(problem: &Problem, needs: &[Need]) -> bool {
    let is_gpu = |d: &crate::problem::Device| matches!(d.tier, Target::Gpu(_));
    let gpus: Vec<u64> = problem.devices.iter().filter(|d| is_gpu(d)).map(|d| d.capacity_bytes).collect();
    let hosts = problem.devices.iter().any(|d| !is_gpu(d));
    // With hosts: the capacity of the GPU that runs their units, or `None` where they run on
    // the host itself (llama.cpp's CPU layers leave nothing on a GPU).
    let runs_on: Option<Option<u64>> = hosts.then(|| {
        problem
            .offload_runs_on
            .and_then(|r| problem.devices.get(r))
            .filter(|d| is_gpu(d))
            .map(|d| d.capacity_bytes)
    });
    let largest = gpus.iter().copied().max().unwrap_or(0);
    let slack = u128::from(BOUND_SLACK_BYTES);
    let needs: Vec<Need> = needs.iter().copied().filter(|n| n.copies > 0).collect();
    for n in &needs {
        let alone = u128::from(n.lasting) + u128::from(n.resident) + u128::from(n.work);
        let on_a_gpu = alone <= u128::from(largest) + slack;
        let offloaded = n.offloadable
            && match runs_on {
                None => false,
                Some(None) => true,
                Some(Some(capacity)) => alone <= u128::from(capacity) + slack,
            };
        if !on_a_gpu && !offloaded {
            return true;
        }
    }
    let mut sizes: Vec<u64> = needs.iter().map(|n| n.work).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let slack_all = slack * gpus.len().max(1) as u128;
    for theta in sizes {
        let room: u128 = gpus.iter().map(|&c| u128::from(c.saturating_sub(theta))).sum();
        let members: Vec<Need> = needs.iter().copied().filter(|n| n.work >= theta).collect();
        // Their bytes on GPUs if nothing were offloaded (units that can leave the GPUs whole,
        // for a host that runs them, not counted).
        let on_gpus: u128 = members
            .iter()
            .filter(|n| !(n.offloadable && runs_on == Some(None)))
            .map(|n| u128::from(n.copies) * (u128::from(n.lasting) + u128::from(n.resident)))
            .sum();
        let relief = match runs_on {
            Some(Some(capacity)) => offload_relief(&members, capacity),
            None | Some(None) => 0,
        };
        if on_gpus.saturating_sub(relief) > room + slack_all {
            return true;
        }
    }
    false
}

/// The most resident bytes that offloading `members` can take off the GPUs when the GPU that
/// runs offloaded units has `capacity`: an offloaded copy's resident bytes and work must fit
/// there as its workspace, and their lasting bytes beside the workspace of the one running
/// (at least the smallest resident + work among them). A fractional knapsack (resident bytes
/// per lasting byte, best first), so never less than any real choice of units; rounded up.
fn offload_relief(members: &[Need], capacity: u64) -> u128 {
    let slack = u128::from(BOUND_SLACK_BYTES);
    let runs = |n: &&Need| u128::from(n.resident) + u128::from(n.work) <= u128::from(capacity) + slack;
    let offloadable: Vec<&Need> = members.iter().filter(|n| n.offloadable).filter(runs).collect();
    let Some(smallest) = offloadable.iter().map(|n| u128::from(n.resident) + u128::from(n.work)).min() else {
        return 0;
    };
    let mut room = (u128::from(capacity) + slack - smallest) as f64;
    let mut relief = 0.0;
    let mut items: Vec<(f64, f64, f64)> = Vec::new();
    for n in &offloadable {
        let (copies, lasting, resident) = (n.copies as f64, n.lasting as f64, n.resident as f64);
        if n.lasting == 0 {
            relief += copies * resident;
        } else {
            items.push((resident / lasting, lasting * copies, resident * copies));
        }
    }
    items.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (ratio, lasting, resident) in items {
        if room <= 0.0 {
            break;
        }
        if lasting <= room {
            relief += resident;
            room -= lasting;
        } else {
            relief += ratio * room;
            room = 0.0;
        }
    }
    relief.ceil() as u128
}

/// The largest value in `low..=high` for which `ok` holds (the what-if boundary search, from
/// `start`); `None` when even `low` fails.
fn largest(low: u64, high: u64, start: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    let found = search::largest::<(), Infallible>(low, high, start, |v| Ok((ok(v), ())));
    found.ok()?.below.map(|(v, _)| v)
}

/// The smallest value in `low..=high` for which `ok` holds (the what-if boundary search, from
/// `start` up); `None` when none does.
fn fewest(low: u32, high: u32, start: u32, mut ok: impl FnMut(u32) -> bool) -> Option<u32> {
    let found = search::smallest::<(), Infallible>(low.into(), high.into(), start.into(), |v| {
        Ok((u32::try_from(v).is_ok_and(&mut ok), ()))
    });
    found.ok()?.above.and_then(|(v, _)| u32::try_from(v).ok())
}

/// The largest value in `low..=high` that `open` leaves open, by bisection (the bounds grow
/// with the value); `None` when `low` is closed.
fn open_up_to(low: u64, high: u64, mut open: impl FnMut(u64) -> bool) -> Option<u64> {
    if low > high || !open(low) {
        return None;
    }
    if open(high) {
        return Some(high);
    }
    let (mut good, mut bad) = (low, high);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if open(mid) { good = mid } else { bad = mid }
    }
    Some(good)
}

/// The smallest value in `low..=high` that `open` leaves open, by bisection (the bounds shrink
/// as the value grows); `None` when `high` is closed: [`open_up_to`] counted down from `high`.
fn open_from(low: u32, high: u32, mut open: impl FnMut(u32) -> bool) -> Option<u32> {
    if low > high {
        return None;
    }
    let below = open_up_to(0, u64::from(high - low), |down| open(high - down as u32))?;
    Some(high - below as u32)
}

/// The profile with `n` GPUs of its first GPU's kind, when it has a catalog kind.
fn more_gpus(hardware: &HardwareProfile, n: u32) -> Option<(HardwareProfile, String)> {
    let kind = hardware.devices.first()?.model.clone()?;
    let spec = format!("{n}x{kind}");
    hardware::load(&spec).ok().map(|h| (h, spec))
}

/// One remedy to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    Batch,
    Sequence,
    GradCheckpointing,
    Lora,
    Quantize(usize),
    Offload,
    Headroom,
    /// More GPUs with the candidate workload of this index (0: the workload as given).
    MoreGpus(usize),
}

/// What a remedy's search found: the change, its utilisation when it fits, whether a probe
/// behind it was left undecided, and the value found (batch, sequence steps, GPUs).
struct Outcome {
    change: Change,
    utilisation: Option<f64>,
    undecided: bool,
    value: Option<u64>,
}

/// The inputs every remedy's search reads.
struct Subject<'a> {
    hardware: &'a HardwareProfile,
    workload: &'a Workload,
    request: &'a Request,
    quantized: Vec<(Workload, Quantization)>,
}

impl Subject<'_> {
    /// The workload of more-GPUs candidate `c` and its quantization.
    fn candidate(&self, c: usize) -> (&Workload, Option<Quantization>) {
        match c.checked_sub(1).and_then(|q| self.quantized.get(q)) {
            Some((w, q)) => (w, Some(*q)),
            None => (self.workload, None),
        }
    }
}

/// The verified remedies, and the changes whose probes ran out of time without a remedy.
fn remedies(
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    probes: &Probes,
) -> (Vec<Remedy>, Vec<Change>) {
    let training = workload.mode == Mode::Train;
    let full = matches!(workload.finetune, Finetune::Full);
    let mut quantized = Vec::new();
    if workload.quant == Quant::None {
        for quant in [Bitsandbytes::Int8, Bitsandbytes::Nf4DoubleQuant] {
            let (w, lora_rank) = with_quant(workload, quant.quant());
            quantized.push((w, Quantization { quant, lora_rank }));
        }
    }
    let subject = Subject { hardware, workload, request, quantized };
    let mut tasks = Vec::new();
    if workload.batch > 1 {
        tasks.push(Task::Batch);
    }
    if workload.seq > SEQ_STEP {
        tasks.push(Task::Sequence);
    }
    if training && workload.grad_checkpointing == GradCheckpointing::Off {
        tasks.push(Task::GradCheckpointing);
    }
    if training && full {
        tasks.push(Task::Lora);
    }
    if request.headroom > 0.0 {
        tasks.push(Task::Headroom);
    }
    tasks.extend((0..subject.quantized.len()).map(Task::Quantize));
    if !training && !request.offload && matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4)
    {
        tasks.push(Task::Offload);
    }
    tasks.extend((0..=subject.quantized.len()).map(Task::MoreGpus));
    // First round: bytes and the quick solves for every remedy; then the plan as asked for
    // those left undecided, each with its share of what is left.
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(tasks.len());
    for (i, &task) in tasks.iter().enumerate() {
        probes.share_among(tasks.len() - i);
        outcomes.push(search_remedy(task, &subject, probes, None));
    }
    probes.thorough.set(true);
    let open: Vec<usize> = (0..tasks.len()).filter(|&i| outcomes[i].undecided).collect();
    for (j, &i) in open.iter().enumerate() {
        probes.share_among(open.len() - j);
        outcomes[i] = search_remedy(tasks[i], &subject, probes, Some(outcomes[i].value));
    }
    let mut out = Vec::new();
    let mut undecided = Vec::new();
    for (task, outcome) in tasks.iter().zip(outcomes) {
        match outcome.utilisation {
            Some(utilisation) => out.push(Remedy { change: outcome.change, utilisation }),
            None if outcome.undecided => undecided.push(outcome.change),
            None => {}
        }
        // More GPUs stop being offered once six remedies are.
        if matches!(task, Task::MoreGpus(_)) && out.len() >= 6 {
            break;
        }
    }
    (out, undecided)
}

/// Searches one remedy with the probes' current round. The second round is given what the
/// first found (`before`): a batch or sequence searches up from the one found (or from the
/// smallest when none was), more GPUs below the count found.
fn search_remedy(task: Task, s: &Subject, probes: &Probes, before: Option<Option<u64>>) -> Outcome {
    probes.take_undecided();
    let (hardware, request) = (s.hardware, s.request);
    // One probe, its bounds checked whatever the time: what it found, and whether undecided.
    let once = |key: Key, w: &Workload, r: &Request| {
        probes.open(key, hardware, w, r);
        let probe = probes.probe(key, hardware, w, r);
        (probe, probes.take_undecided())
    };
    let single = |key: Key, w: &Workload, change: Change| {
        let (probe, undecided) = once(key, w, request);
        Outcome { change, utilisation: probe.utilisation(), undecided, value: None }
    };
    // Where a batch or sequence search starts: from the open end in the first round.
    let from = |high: u64| match before {
        None => (1, high),
        Some(Some(found)) => (found.min(high), (found + 1).min(high)),
        Some(None) => (1, 1),
    };
    match task {
        Task::Batch => {
            let at = |b: u64| Workload { batch: b, ..s.workload.clone() };
            let high = open_up_to(1, s.workload.batch - 1, |b| {
                probes.open(Key::Batch(b), hardware, &at(b), request)
            });
            let best = high.and_then(|high| {
                let (low, start) = from(high);
                largest(low, high, start, |b| {
                    probes.probe(Key::Batch(b), hardware, &at(b), request).utilisation().is_some()
                })
            });
            let undecided = probes.take_undecided();
            let utilisation = best.and_then(|b| probes.found(Key::Batch(b))).and_then(Probe::utilisation);
            let change = Change::Batch { batch: best, larger_undecided: undecided && best.is_some() };
            Outcome { change, utilisation, undecided, value: best }
        }
        Task::Sequence => {
            let step = SEQ_STEP;
            let at = |k: u64| Workload {
                seq: k * step,
                prompt: s.workload.prompt.map(|p| p.min(k * step)),
                ..s.workload.clone()
            };
            let high = open_up_to(1, (s.workload.seq - 1) / step, |k| {
                probes.open(Key::Sequence(k), hardware, &at(k), request)
            });
            let best = high.and_then(|high| {
                let (low, start) = from(high);
                largest(low, high, start, |k| {
                    probes.probe(Key::Sequence(k), hardware, &at(k), request).utilisation().is_some()
                })
            });
            let undecided = probes.take_undecided();
            let utilisation = best.and_then(|k| probes.found(Key::Sequence(k))).and_then(Probe::utilisation);
            let change = Change::Sequence {
                seq: best.map(|k| k * step),
                longer_undecided: undecided && best.is_some(),
            };
            Outcome { change, utilisation, undecided, value: best }
        }
        Task::GradCheckpointing => {
            let w = Workload { grad_checkpointing: GradCheckpointing::Full, ..s.workload.clone() };
            single(Key::GradCheckpointing, &w, Change::GradCheckpointing)
        }
        Task::Lora => {
            let lora = Finetune::Lora { rank: LORA_RANK, alpha: 32, targets: Vec::new() };
            let w = Workload { finetune: lora, ..s.workload.clone() };
            single(Key::Lora, &w, Change::Lora { rank: LORA_RANK })
        }
        Task::Quantize(q) => {
            let (w, quantization) = &s.quantized[q];
            single(Key::Quantize(q), w, Change::Quantize(*quantization))
        }
        Task::Headroom => {
            // With no headroom the plan fills each GPU to `utilisation` of its usable memory at
            // the most, so the largest headroom that keeps it is what is left, in whole percent;
            // verified by solving with it.
            let none = Request { headroom: 0.0, ..request.clone() };
            let (probe, undecided) = once(Key::Headroom(0), s.workload, &none);
            let Some(filled) = probe.utilisation() else {
                return Outcome {
                    change: Change::Headroom { percent: 0 },
                    utilisation: None,
                    undecided,
                    value: None,
                };
            };
            let percent = ((1.0 - filled) * 100.0).floor().clamp(0.0, 90.0) as u32;
            let at = Request { headroom: f64::from(percent) / 100.0, ..request.clone() };
            let (probe, later) =
                if percent == 0 { (probe, false) } else { once(Key::Headroom(percent), s.workload, &at) };
            Outcome {
                change: Change::Headroom { percent },
                utilisation: probe.utilisation(),
                undecided: undecided || later,
                value: None,
            }
        }
        Task::Offload => {
            let r = Request { offload: true, ..request.clone() };
            let (probe, undecided) = once(Key::Offload, s.workload, &r);
            let modules = match probe {
                Probe::Fits { off_gpus, .. } => Some(off_gpus),
                Probe::DoesNotFit | Probe::Unknown => None,
            };
            Outcome {
                change: Change::Offload { modules },
                utilisation: probe.utilisation(),
                undecided,
                value: None,
            }
        }
        Task::MoreGpus(c) => {
            let (w, quantize) = s.candidate(c);
            let n = hardware.devices.len() as u32;
            let open = |k: u32| {
                more_gpus(hardware, k).is_some_and(|(h, _)| probes.open(Key::MoreGpus(c, k), &h, w, request))
            };
            // The fewest GPUs whose bytes are open: none below can fit.
            let low = open_from(n + 1, MAX_GPUS, open);
            // The second round looks below the count the first found.
            let high = before.flatten().map_or(MAX_GPUS, |k| k as u32);
            let found = low.and_then(|low| {
                fewest(low, high.max(low), low, |k| {
                    more_gpus(hardware, k).is_some_and(|(h, _)| {
                        probes.probe(Key::MoreGpus(c, k), &h, w, request).utilisation().is_some()
                    })
                })
            });
            let undecided = probes.take_undecided();
            let kind = hardware.devices.first().map_or_else(String::new, |d| d.name.clone());
            let fit = found.and_then(|k| {
                let utilisation = probes.found(Key::MoreGpus(c, k)).and_then(Probe::utilisation)?;
                let (h, spec) = more_gpus(hardware, k)?;
                Some((k, utilisation, h, spec))
            });
            match fit {
                Some((k, utilisation, h, spec)) => Outcome {
                    change: Change::MoreGpus {
                        gpus: Some(k),
                        added: Some(k - n),
                        kind: h.devices[0].name.clone(),
                        hardware: Some(spec),
                        quantize,
                    },
                    utilisation: Some(utilisation),
                    undecided,
                    value: Some(u64::from(k)),
                },
                None => Outcome {
                    change: Change::MoreGpus { gpus: None, added: None, kind, hardware: None, quantize },
                    utilisation: None,
                    undecided,
                    value: None,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramplan_profiles::DType;
    use vramplan_profiles::model::{self, ImportOptions};

    fn load(model: &str, hardware: &str) -> (ModelDescription, HardwareProfile) {
        let naming = Runtime::Accelerate.naming();
        (model::load(model, ImportOptions { naming }).unwrap(), hardware::load(hardware).unwrap())
    }

    fn inference(batch: u64, seq: u64) -> Workload {
        Workload { batch, seq, weight_dtype: Some(DType::BF16), ..Workload::default() }
    }

    fn training(dtype: DType) -> Workload {
        Workload { mode: Mode::Train, weight_dtype: Some(dtype), ..Workload::default() }
    }

    fn within(seconds: f64) -> Settings {
        Settings { time_limit_s: Some(seconds), ..Settings::default() }
    }

    fn on_gpus() -> Request {
        Request { offload: false, ..Request::new(Runtime::Accelerate) }
    }

    /// Llama-3.1-405B at 128 K tokens, 4 sequences, on 16 H100s (issue 15): one decoder layer
    /// runs on 160 GiB at that length, more than an H100, so no batch, no quantization and no
    /// count of H100s can help, and bytes alone say so. With the bounds free of the deadline
    /// and no time to solve, no plan is solved, and only the shorter sequence (which needs
    /// solves) is left undecided.
    #[test]
    fn bytes_alone_decide_remedies_with_no_time_to_solve() {
        let (model, hardware) = load("llama-3.1-405b", "16xh100-80gb");
        let request = Request::new(Runtime::Accelerate);
        let mut probes = Probes::new(&model, Settings::default(), Some(Instant::now()));
        probes.bounds_until = None;
        let (remedies, undecided) = remedies(&hardware, &inference(4, 131_072), &request, &probes);
        let effort = probes.effort.get();
        assert_eq!(effort.solves, 0, "{effort:?}");
        assert!(remedies.is_empty(), "{remedies:?}");
        assert_eq!(undecided, vec![Change::Sequence { seq: None, longer_undecided: false }]);
        // Batches 1 to 3, and each of the three workloads at 17 to 64 GPUs by bisection over
        // the bounds, and the two quantized workloads.
        assert!(effort.by_bytes >= 10, "{effort:?}");
    }

    /// A budget of nothing is kept: no build, no solve, every remedy undecided.
    #[test]
    fn no_time_means_no_probe() {
        let (model, hardware) = load("llama-2-70b", "t4");
        let workload = Workload { batch: 4, ..training(DType::BF16) };
        let found = explain(&model, &hardware, &workload, &on_gpus(), &within(0.0));
        assert_eq!((found.effort.probes, found.effort.solves), (0, 0), "{:?}", found.effort);
        assert!(found.shortfalls.is_empty() && found.remedies.is_empty());
        // Batch, sequence, checkpointing, LoRA, the headroom, two quantizations, more GPUs with
        // each of three workloads.
        assert_eq!(found.undecided.len(), 10, "{:?}", found.undecided);
    }

    /// Llama-2-70B full fine-tuning in fp16 on two T4s: bytes rule out most counts of T4s and
    /// start each search at the fewest they leave open, so few plans are solved (33 before the
    /// bounds), and each remedy is the fewest GPUs a plan confirms.
    #[test]
    fn a_does_not_fit_answer_takes_few_solves() {
        let (model, hardware) = load("llama-2-70b", "2xt4");
        let workload = training(DType::F16);
        let request = on_gpus();
        let found = explain(&model, &hardware, &workload, &request, &within(600.0));
        assert!(found.effort.solves <= 20, "{:?}", found.effort);
        assert!(found.effort.probes <= 45, "{:?}", found.effort);
        assert_eq!(found.effort.out_of_time + found.effort.skipped, 0, "{:?}", found.effort);
        assert!(!found.remedies.is_empty());
        for remedy in &found.remedies {
            let Change::MoreGpus { gpus: Some(k), quantize: Some(q), .. } = &remedy.change else {
                panic!("unexpected remedy {remedy:?}");
            };
            let (w, _) = with_quant(&workload, q.quant.quant());
            let verdict = |k: u32| {
                let (h, _) = more_gpus(&hardware, k).unwrap();
                plan(&model, &h, &w, &request, &Settings::default()).unwrap().verdict
            };
            assert_eq!(verdict(*k), Verdict::Fits, "{remedy:?}");
            assert_ne!(verdict(k - 1), Verdict::Fits, "{remedy:?}");
        }
    }

    /// Where bytes alone say "does not fit", the plan proves it; where the plan fits, bytes
    /// leave it open. Each kind of bound: a unit no GPU holds (405B's layer at 128 K tokens for
    /// 3 sequences), the workspace thresholds with offload (1 sequence: a layer's 51 GiB of
    /// workspace leaves room for 3 layers a GPU, and the GPU running offloaded layers holds
    /// their KV cache), the bytes of training state in all (70B on 16 T4s).
    #[test]
    fn the_bytes_bound_agrees_with_the_plan() {
        let (llama405, h100s) = load("llama-3.1-405b", "16xh100-80gb");
        let (llama70, t4s) = load("llama-2-70b", "16xt4");
        let offload = Request::new(Runtime::Accelerate);
        let cases = [
            (&llama405, &h100s, inference(3, 131_072), &offload, true),
            (&llama405, &h100s, inference(1, 131_072), &offload, true),
            (&llama405, &h100s, inference(4, 8192), &offload, false),
            (&llama70, &t4s, training(DType::F16), &on_gpus(), true),
            (
                &llama70,
                &t4s,
                Workload { quant: Quant::Nf4 { double_quant: true }, ..inference(1, 2048) },
                &offload,
                false,
            ),
        ];
        for (model, hardware, workload, request, closed) in cases {
            let built = build::build(model, hardware, &workload, request).unwrap();
            assert_eq!(no_placement(&built.problem), closed, "{workload:?}");
            let verdict = plan(model, hardware, &workload, request, &Settings::default()).unwrap().verdict;
            let expected = if closed { Verdict::DoesNotFit } else { Verdict::Fits };
            assert_eq!(verdict, expected, "{workload:?}");
        }
    }

    #[test]
    fn open_ends_are_found_by_bisection() {
        for edge in 0..=20 {
            let mut calls = 0;
            let found = open_up_to(1, 20, |v| {
                calls += 1;
                v <= edge
            });
            assert_eq!(found, (edge >= 1).then_some(edge));
            assert!(calls <= 7, "{calls} calls");
            let found = open_from(1, 20, |v| u64::from(v) >= edge);
            assert_eq!(found, Some(edge.max(1) as u32));
        }
        assert_eq!(open_from(1, 20, |_| false), None);
    }
}
