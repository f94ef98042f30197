//! The what-if queries: each changes the question's workload or hardware along one axis and
//! returns the boundary with the probes on both sides of it.
//!
//! - [`max_batch`], [`max_seq`]: the largest batch or sequence that fits (the sequence is the
//!   training length, the inference context, vLLM's `--max-model-len`, llama.cpp's `-c`), capped
//!   at the model's positions unless asked to go past them.
//! - [`max_concurrency`]: sequences of a given length served at once, under each engine:
//!   transformers (the largest batch), vLLM (its KV capacity in tokens over the length, as vLLM
//!   logs "Maximum concurrency"), llama.cpp (the largest `-c` over the length: `-np` slots share
//!   it).
//! - [`min_gpus`]: the fewest GPUs of one kind, with the plan or parallel layout that uses them.
//! - [`best_quant`]: the highest weight precision that fits, for the engine.
//! - [`cheapest`]: every profile of a list with its price per hour, and the cheapest that fits.

use super::search::{self, Boundary};
use super::{
    Binding, Fit, Prober, Question, RunFlags, binding, fp8_capable, probe, replay_on_map, run_flags,
    with_quant,
};
use serde::Serialize;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::{self, HardwareProfile, Prices};
use vramplan_sim::engines::vllm;
use vramplan_sim::workload::{Engine, Mode, Parallelism, Quant, Workload};

/// The largest batch searched.
const MAX_BATCH: u64 = 1 << 20;

/// The longest sequence searched where the model's positions do not cap it.
const MAX_SEQ: u64 = 1 << 24;

/// The most GPUs `min-gpus` tries.
const MAX_GPUS: u64 = 64;

/// The quantity a [`Largest`] answer is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    /// The micro-batch (training) or the sequences generated together (inference).
    Batch,
    /// Tokens per sequence: training length, inference context, vLLM's `--max-model-len`.
    Seq,
    /// llama.cpp's context (`-c`), shared by its slots.
    Context,
}

/// Why the search stopped short of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "cap", content = "value")]
pub enum Cap {
    /// The model's positions (`max_position_embeddings`).
    Positions(u64),
    /// The end of the range searched.
    Range(u64),
}

/// The largest value of one quantity that fits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Largest {
    /// What was searched.
    pub quantity: Quantity,
    /// The largest value that fits; `None` when even the smallest does not.
    pub value: Option<u64>,
    /// Its probe.
    pub fit: Option<Fit>,
    /// The next value, which does not fit (`value + 1` where the search is exact); `None` when
    /// a cap stopped the search first.
    pub next: Option<u64>,
    /// Its probe.
    pub next_fit: Option<Fit>,
    /// What stops `next`.
    pub binding: Option<Binding>,
    /// Set when the search stopped at a cap, not at memory (`next` is then `None`).
    pub cap: Option<Cap>,
    /// The peak grew with the value over every probe; otherwise the range was scanned.
    pub monotone: bool,
    /// The scan's step where it was not monotone (1: exact).
    pub stride: u64,
    /// Full simulations made.
    pub probes: u32,
    /// The workload of the answer (the question's with `value`).
    pub workload: Workload,
    /// What to type to run it.
    pub run: Vec<RunFlags>,
}

/// The largest micro-batch (training) or batch of sequences generated together (inference,
/// transformers) that fits.
pub fn max_batch(question: &Question) -> Result<Largest, InputError> {
    if !matches!(question.workload.engine, Engine::Transformers) {
        return Err(InputError::new(
            "whatif max-batch",
            "vLLM and llama.cpp schedule the sequences they serve themselves; the batch is not a setting there",
        )
        .with_fix("ask `vramplan whatif max-concurrency` for the sequences they serve at once"));
    }
    let with = |b: u64| Workload { batch: b, ..question.workload.clone() };
    largest_of(question, Quantity::Batch, 1, MAX_BATCH, question.workload.batch, None, with)
}

/// The longest sequence that fits: the training length, the inference context (the prompt is
/// cut to it), vLLM's `--max-model-len`, llama.cpp's `-c`. Capped at the model's positions
/// unless `past_positions`.
pub fn max_seq(question: &Question, past_positions: bool) -> Result<Largest, InputError> {
    let positions = question.model.facts.max_positions;
    // A learned table of positions is a hard limit: no sequence past it runs.
    if let (true, Some((table, limit))) = (past_positions, question.model.learned_positions()) {
        return Err(InputError::new(
            "--past-positions",
            format!(
                "{}'s positions are a learned table of {limit} (`{table}`): a longer sequence raises \
                 `IndexError: index out of range in self`, so none past it runs",
                question.model.name
            ),
        )
        .with_fix("leave out --past-positions: the answer stops at the table's length"));
    }
    let cap = (!past_positions && positions > 0).then_some(Cap::Positions(positions));
    let high = match cap {
        Some(Cap::Positions(p)) => p,
        _ => MAX_SEQ,
    };
    let start = question.workload.seq.min(high);
    largest_of(question, Quantity::Seq, 1, high, start, cap, |s| with_seq(question.workload, s))
}

/// `workload` at sequence `seq`: the prompt is cut to it, and llama.cpp's context follows it.
fn with_seq(workload: &Workload, seq: u64) -> Workload {
    let engine = match workload.engine {
        Engine::LlamaCpp { n_ubatch, .. } => Engine::LlamaCpp { n_ctx: seq, n_ubatch },
        ref other => other.clone(),
    };
    let mut w = Workload { seq, prompt: workload.prompt.map(|p| p.min(seq)), engine, ..workload.clone() };
    // The length probed is vLLM's --max-model-len, not `auto`.
    w.vllm.max_model_len_auto = false;
    w
}

/// The boundary of `quantity` in `low..=high`, starting at `start`; `with(v)` is the workload at
/// value `v`.
fn largest_of(
    question: &Question,
    quantity: Quantity,
    low: u64,
    high: u64,
    start: u64,
    cap: Option<Cap>,
    with: impl Fn(u64) -> Workload,
) -> Result<Largest, InputError> {
    // The probes differ in one shape: what does not depend on it is resolved once.
    let base = with(start);
    let prober = Prober::new(*question, question.hardware, &base);
    let mut found = search::largest(low, high, start, |v| prober.probe(&with(v)).map(|fit| (fit.fits, fit)))?;
    // Where the answer's map was solved, the next value is replayed on that map: what runs out
    // when the answer grows by one.
    if let (Some((_, fit)), Some((next, beyond))) = (&found.below, &mut found.above)
        && let Some(map) = &fit.device_map
    {
        let proven = beyond.proven;
        *beyond = replay_on_map(question, question.hardware, &with(*next), map)?;
        beyond.proven = proven;
        found.probes += 1;
    }
    Ok(largest_answer(question, quantity, found, cap.or(Some(Cap::Range(high))), with))
}

fn largest_answer(
    question: &Question,
    quantity: Quantity,
    found: Boundary<Fit>,
    cap: Option<Cap>,
    with: impl Fn(u64) -> Workload,
) -> Largest {
    let Boundary { below, above, monotone, stride, probes } = found;
    let value = below.as_ref().map(|(v, _)| *v);
    let workload = value.map_or_else(|| question.workload.clone(), &with);
    let binding = above.as_ref().and_then(|(_, f)| binding(below.as_ref().map(|(_, f)| f), f));
    let fit = below.map(|(_, f)| f);
    let run = match &fit {
        Some(f) => run_flags(question.model, question.hardware, question.workload, &workload, f),
        None => Vec::new(),
    };
    Largest {
        quantity,
        value,
        next: above.as_ref().map(|(v, _)| *v),
        cap: if above.is_none() && value.is_some() { cap } else { None },
        next_fit: above.map(|(_, f)| f),
        fit,
        binding,
        monotone,
        stride,
        probes,
        workload,
        run,
    }
}

/// The engines [`max_concurrency`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// transformers `generate`: a contiguous KV cache per sequence.
    Transformers,
    /// vLLM: the paged KV cache.
    Vllm,
    /// SGLang: the token pool sized from `--mem-fraction-static`.
    Sglang,
    /// llama.cpp (`llama-server`): `-np` slots sharing a context of `-c` tokens.
    LlamaCpp,
}

/// Sequences of one length served at once by one engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Concurrency {
    /// The engine.
    pub engine: EngineKind,
    /// Tokens per sequence.
    pub seq: u64,
    /// Sequences of `seq` tokens that fit at once; `None` when not even one does.
    pub sequences: Option<u64>,
    /// Tokens of KV cache: vLLM's paged capacity, llama.cpp's largest `-c`, transformers'
    /// sequences × length.
    pub kv_capacity_tokens: Option<u64>,
    /// vLLM: sequences it schedules per step at most (`--max-num-seqs`' default on this GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_limit: Option<u64>,
    /// The search behind it (transformers' batch, llama.cpp's context); vLLM's figure is one
    /// budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<Largest>,
    /// The engine refuses the model or the workload (why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// vLLM: the tensor-parallel size this answer needs, where the workload named none and the
    /// model does not fit the one GPU vLLM then uses (its default `--tensor-parallel-size 1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<u32>,
    /// vLLM, where not one sequence fits: what runs out, and by how much.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<Binding>,
    /// What to type to run it.
    pub run: Vec<RunFlags>,
}

/// Sequences of `seq` tokens served at once on the question's hardware, under each engine with
/// its defaults (the workload's own settings where it already names that engine).
pub fn max_concurrency(question: &Question, seq: u64) -> Vec<Concurrency> {
    let base = Workload { mode: Mode::Inference, seq, prompt: None, ..question.workload.clone() };
    let mut answers = Vec::new();
    for engine in [EngineKind::Transformers, EngineKind::Vllm, EngineKind::Sglang, EngineKind::LlamaCpp] {
        let answer = match engine {
            EngineKind::Transformers => {
                let w = Workload { engine: Engine::Transformers, ..base.clone() };
                concurrency_by_search(question, &w, engine, seq, max_batch)
            }
            EngineKind::Vllm => vllm_concurrency(question, &base, seq),
            EngineKind::Sglang => sglang_concurrency(question, &base, seq),
            EngineKind::LlamaCpp => {
                let n_ubatch = match base.engine {
                    Engine::LlamaCpp { n_ubatch, .. } => n_ubatch,
                    _ => Engine::LLAMACPP_UBATCH,
                };
                let w = Workload { engine: Engine::LlamaCpp { n_ctx: seq, n_ubatch }, ..base.clone() };
                concurrency_by_search(question, &w, engine, seq, |q| max_seq(q, true))
            }
        };
        answers.push(answer);
    }
    answers
}

/// transformers and llama.cpp: a boundary search (the batch; the context, shared by slots).
fn concurrency_by_search(
    question: &Question,
    workload: &Workload,
    engine: EngineKind,
    seq: u64,
    search: impl Fn(&Question) -> Result<Largest, InputError>,
) -> Concurrency {
    let q = Question { workload, ..*question };
    // A vision-language sample's images add their tokens to each sequence.
    let seq = seq.saturating_add(workload.image_tokens(question.model));
    match search(&q) {
        Ok(found) => {
            let (sequences, kv_tokens) = match (engine, found.value) {
                (EngineKind::LlamaCpp, Some(ctx)) => (Some(ctx / seq).filter(|&n| n > 0), Some(ctx)),
                (_, Some(batch)) => (Some(batch), Some(batch.saturating_mul(seq))),
                (_, None) => (None, None),
            };
            let mut run = found.run.clone();
            if let (EngineKind::LlamaCpp, Some(n)) = (engine, sequences) {
                for flags in &mut run {
                    flags.set("-c", (n * seq).to_string());
                    flags.set("-np", n.to_string());
                }
            }
            Concurrency {
                engine,
                seq,
                sequences,
                kv_capacity_tokens: kv_tokens,
                scheduler_limit: None,
                search: Some(found),
                refused: None,
                tensor_parallel: None,
                binding: None,
                run,
            }
        }
        Err(e) => refused(engine, seq, e),
    }
}

fn refused(engine: EngineKind, seq: u64, e: InputError) -> Concurrency {
    Concurrency {
        engine,
        seq,
        sequences: None,
        kv_capacity_tokens: None,
        scheduler_limit: None,
        search: None,
        refused: Some(e.to_string()),
        tensor_parallel: None,
        binding: None,
        run: Vec::new(),
    }
}

/// vLLM: the paged KV cache's tokens over the length, as vLLM logs "Maximum concurrency for N
/// tokens per request" (rounded down to whole sequences), once one request of that length fits.
fn vllm_concurrency(question: &Question, base: &Workload, seq: u64) -> Concurrency {
    let engine = match base.engine {
        Engine::Vllm { .. } => base.engine.clone(),
        _ => Engine::VLLM_DEFAULT,
    };
    widened(question, &Workload { engine, ..base.clone() }, seq, vllm_concurrency_with)
}

/// A serving engine runs on one GPU unless told (vLLM's `--tensor-parallel-size` and SGLang's
/// `--tp-size` default to 1): where the workload names no parallelism and that one GPU holds
/// nothing, the answer over the profile's GPUs is the one with the largest tensor-parallel size
/// they allow (`answer_with` answers for a workload as it stands).
fn widened(
    question: &Question,
    w: &Workload,
    seq: u64,
    answer_with: fn(&Question, &Workload, u64) -> Concurrency,
) -> Concurrency {
    let answer = answer_with(question, w, seq);
    let gpus = question.hardware.devices.len() as u64;
    if answer.sequences.is_some()
        || answer.refused.is_some()
        || gpus < 2
        || w.parallelism != Parallelism::Single
    {
        return answer;
    }
    // The largest size the engine shards the model over (heads, KV heads, MLP features).
    let accepted = |n: &u64| {
        u32::try_from(*n)
            .is_ok_and(|n| vramplan_sim::tensor_parallel::serving_tp_refusal(question.model, n).is_none())
    };
    let Some(size) = (2..=gpus).rev().find(accepted) else { return answer };
    let wide = Workload { parallelism: Parallelism::tensor(size as u32), ..w.clone() };
    let mut over = answer_with(question, &wide, seq);
    if over.refused.is_some() {
        return answer;
    }
    over.tensor_parallel = Some(size as u32);
    over
}

/// vLLM's answer for workload `w` as it stands.
fn vllm_concurrency_with(question: &Question, w: &Workload, seq: u64) -> Concurrency {
    let fit = match probe(question, question.hardware, w) {
        Ok(fit) => fit,
        Err(e) => return refused(EngineKind::Vllm, seq, e),
    };
    let tp = w.tensor_parallel_size();
    let limit = question
        .hardware
        .devices
        .first()
        .and_then(|d| vllm::budget(question.model, d, w, tp).ok())
        .map(|b| b.max_num_seqs);
    let capacity = fit.kv_capacity_tokens;
    let sequences = capacity.map(|c| c / seq.max(1)).filter(|&n| n > 0 && fit.fits);
    let run = match sequences {
        Some(n) => {
            let mut run = run_flags(question.model, question.hardware, question.workload, w, &fit);
            for flags in &mut run {
                flags.set("--max-num-seqs", n.min(limit.unwrap_or(n)).to_string());
            }
            run
        }
        None => Vec::new(),
    };
    Concurrency {
        engine: EngineKind::Vllm,
        seq,
        sequences,
        kv_capacity_tokens: capacity,
        scheduler_limit: limit.filter(|_| sequences.is_some()),
        search: None,
        refused: None,
        tensor_parallel: None,
        binding: if sequences.is_none() { super::binding(None, &fit) } else { None },
        run,
    }
}

/// SGLang: the token pool (`max_total_num_tokens`) over the length, once one request of that
/// length fits; the workload's SGLang settings where it names SGLang, else SGLang's defaults.
fn sglang_concurrency(question: &Question, base: &Workload, seq: u64) -> Concurrency {
    let engine = match base.engine {
        Engine::Sglang { .. } => base.engine.clone(),
        _ => Engine::SGLANG_DEFAULT,
    };
    widened(question, &Workload { engine, ..base.clone() }, seq, sglang_concurrency_with)
}

/// SGLang's answer for workload `w` as it stands.
fn sglang_concurrency_with(question: &Question, w: &Workload, seq: u64) -> Concurrency {
    let fit = match probe(question, question.hardware, w) {
        Ok(fit) => fit,
        Err(e) => return refused(EngineKind::Sglang, seq, e),
    };
    let capacity = fit.kv_capacity_tokens;
    let sequences = capacity.map(|c| c / seq.max(1)).filter(|&n| n > 0 && fit.fits);
    let run = match sequences {
        Some(n) => {
            let mut run = run_flags(question.model, question.hardware, question.workload, w, &fit);
            for flags in &mut run {
                flags.set("--max-running-requests", n.to_string());
            }
            run
        }
        None => Vec::new(),
    };
    Concurrency {
        engine: EngineKind::Sglang,
        seq,
        sequences,
        kv_capacity_tokens: capacity,
        scheduler_limit: None,
        search: None,
        refused: None,
        tensor_parallel: None,
        binding: if sequences.is_none() { super::binding(None, &fit) } else { None },
        run,
    }
}

/// The fewest GPUs of one kind that fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fewest {
    /// The GPU's catalog key (`t4`).
    pub kind: String,
    /// The fewest that fit; `None` when no count up to the search's end does.
    pub gpus: Option<u64>,
    /// The hardware short form that gives them (`4xt4`).
    pub hardware: Option<String>,
    /// The `--parallel` layout they run as, where the count is a tensor-parallel one
    /// (`tp=4`, `tp=4,pp=3` under vLLM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel: Option<String>,
    /// Its probe (with the device map where one copy is spread over them).
    pub fit: Option<Fit>,
    /// The count just below, which does not fit (`None` when one GPU fits).
    pub fewer: Option<u64>,
    /// Its probe.
    pub fewer_fit: Option<Fit>,
    /// What stops `fewer`.
    pub binding: Option<Binding>,
    /// Counts tried where not every count is possible (vLLM's tensor-parallel sizes divide the
    /// attention heads); empty where every count up to the end was open.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counts: Vec<u64>,
    /// Full simulations or plans made.
    pub probes: u32,
    /// What to type to run it.
    pub run: Vec<RunFlags>,
}

/// The fewest GPUs of `kind` (a catalog key; default the question's first GPU's) that fit the
/// workload. One copy over several GPUs is planned for each count; under DDP, ZeRO or FSDP every
/// GPU is a rank; under vLLM each count runs as [`vllm_shape`] lays it out (tensor parallel inside
/// a server, pipeline stages beyond it), under SGLang the count is its `--tp-size`.
pub fn min_gpus(question: &Question, kind: Option<&str>) -> Result<Fewest, InputError> {
    let kind = match kind {
        Some(k) => k.to_string(),
        None => question.hardware.devices.first().and_then(|d| d.model.clone()).ok_or_else(|| {
            InputError::new("--hardware", "the profile's first GPU is not a catalog kind")
                .with_fix("name the kind with `--gpu t4` (see `vramplan profiles`)")
        })?,
    };
    let load = |n: u64| hardware::load(&format!("{n}x{kind}"));
    load(1)?;
    let vllm = matches!(question.workload.engine, Engine::Vllm { .. });
    let replicas = match question.workload.engine {
        Engine::Sglang { dp_size, .. } => dp_size.unwrap_or(1),
        _ => question.workload.data_parallel_size(),
    };
    if replicas > 1 {
        return Err(InputError::new(
            "min-gpus",
            format!("the workload runs {replicas} data-parallel replicas, and min-gpus sizes one copy of the model"),
        )
        .with_fix("leave out the data-parallel size: the answer is one replica's GPUs, to multiply by the replicas"));
    }
    let heads = question.model.facts.num_attention_heads.max(1);
    let layers = vramplan_sim::tensor_parallel::decoder_layers(question.model).max(1);
    let serving_tp = |tp: u64| {
        u32::try_from(tp)
            .is_ok_and(|tp| vramplan_sim::tensor_parallel::serving_tp_refusal(question.model, tp).is_none())
    };
    let workload_on = |n: u64| -> Workload {
        let mut w = question.workload.clone();
        if vllm {
            let (tp, pp) = vllm_shape(layers, n, serving_tp).unwrap_or((n, 1));
            w.parallelism = if n > 1 {
                Parallelism::Tensor { size: tp as u32, pipeline: pp as u32 }
            } else {
                Parallelism::Single
            };
        } else if matches!(w.engine, Engine::Sglang { .. })
            || matches!(w.parallelism, Parallelism::Tensor { .. })
        {
            w.parallelism = if n > 1 { Parallelism::tensor(n as u32) } else { Parallelism::Single };
        }
        w
    };
    let fits_on = |n: u64| -> Result<(bool, (Fit, HardwareProfile)), InputError> {
        let h = load(n)?;
        let fit = probe(question, &h, &workload_on(n))?;
        Ok((fit.fits, (fit, h)))
    };
    let tensor_parallel = matches!(question.workload.engine, Engine::Vllm { .. } | Engine::Sglang { .. })
        || matches!(question.workload.parallelism, Parallelism::Tensor { .. });
    let (fewer, found, counts, probes) = if tensor_parallel {
        // Only counts that divide the heads shard them (under vLLM, counts with a tensor ×
        // pipeline shape); scan those in order.
        let counts: Vec<u64> = (1..=MAX_GPUS)
            .filter(
                |&n| if vllm { vllm_shape(layers, n, serving_tp).is_some() } else { heads.is_multiple_of(n) },
            )
            .collect();
        let mut fewer = None;
        let mut found = None;
        let mut probes = 0;
        for &n in &counts {
            probes += 1;
            let (ok, carried) = match fits_on(n) {
                Ok(r) => r,
                Err(_) if n > 1 => continue,
                Err(e) => return Err(e),
            };
            if ok {
                found = Some((n, carried));
                break;
            }
            fewer = Some((n, carried));
        }
        (fewer, found, counts, probes)
    } else {
        let b = search::smallest(1, MAX_GPUS, question.hardware.devices.len() as u64, fits_on)?;
        (b.below, b.above, Vec::new(), b.probes)
    };
    let binding = fewer.as_ref().and_then(|(_, (f, _))| binding(None, f));
    let run = match &found {
        Some((n, (fit, h))) => run_flags(question.model, h, question.workload, &workload_on(*n), fit),
        None => Vec::new(),
    };
    let parallel = found
        .as_ref()
        .filter(|_| tensor_parallel)
        .map(|(n, _)| crate::plan::parallel_flag(workload_on(*n).parallelism));
    // Every count open: nothing to list.
    let counts = if counts.len() as u64 == MAX_GPUS { Vec::new() } else { counts };
    Ok(Fewest {
        hardware: found.as_ref().map(|(n, _)| format!("{n}x{kind}")),
        parallel,
        gpus: found.as_ref().map(|(n, _)| *n),
        fit: found.map(|(_, (f, _))| f),
        fewer: fewer.as_ref().map(|(n, _)| *n),
        fewer_fit: fewer.map(|(_, (f, _))| f),
        kind,
        binding,
        counts,
        probes,
        run,
    })
}

/// GPUs in one server's NVLink domain (NVIDIA DGX/HGX H100 and A100: 8), the tensor-parallel
/// group vLLM's multi-node guide keeps inside a node ("the tensor parallel size is the number
/// of GPUs in each node, and the pipeline parallel size the number of nodes").
const GPUS_PER_SERVER: u64 = 8;

/// The tensor × pipeline shape vLLM runs on `n` GPUs: the largest tensor-parallel size up to a
/// server's GPUs that divides `n` and that vLLM accepts for the model (`tp_ok`: the heads, the
/// KV heads and the MLP features divide, `serving_tp_refusal`), and `n / tp` pipeline stages,
/// each with at least one of the `layers`; `None` when there are more stages than layers.
pub fn vllm_shape(layers: u64, n: u64, tp_ok: impl Fn(u64) -> bool) -> Option<(u64, u64)> {
    let tp = (1..=n.min(GPUS_PER_SERVER)).rev().find(|&tp| n.is_multiple_of(tp) && tp_ok(tp))?;
    let pp = n / tp;
    (pp <= layers).then_some((tp, pp))
}

/// One weight precision tried by [`best_quant`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantChoice {
    /// The quantization (`none` is the model's dtype, or `--dtype`).
    pub quant: Quant,
    /// Set when the choice trains LoRA adapters of this rank instead of the full fine-tune.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_rank: Option<u64>,
    /// Its probe; `None` where the runtime refuses it (`refused` says why).
    pub fit: Option<Fit>,
    /// Why the runtime refuses it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// What to type to run it (the chosen one only).
    pub run: Vec<RunFlags>,
}

/// The weight precisions the workload's engine offers, from the highest down: transformers the
/// model's dtype, fp8 (inference on GPUs with fp8), bitsandbytes int8 and nf4; vLLM the dtype,
/// fp8, bitsandbytes 4-bit; llama.cpp GGUF F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M, Q2_K.
pub(crate) fn quant_candidates(question: &Question) -> Vec<Quant> {
    let w = question.workload;
    let fp8 = fp8_capable(question.hardware);
    match w.engine {
        Engine::Transformers => {
            let fp8 = (fp8 && w.mode == Mode::Inference).then_some(Quant::Fp8 { block: 128 });
            [Some(Quant::None), fp8, Some(Quant::Int8), Some(Quant::Nf4 { double_quant: true })]
                .into_iter()
                .flatten()
                .collect()
        }
        Engine::Vllm { .. } => {
            let fp8 = fp8.then_some(Quant::Fp8 { block: 128 });
            [Some(Quant::None), fp8, Some(Quant::Nf4 { double_quant: false })].into_iter().flatten().collect()
        }
        // SGLang is sized for plain weights and checkpoints' own quantization only.
        Engine::Sglang { .. } => vec![Quant::None],
        Engine::LlamaCpp { .. } => ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K"]
            .into_iter()
            .map(|t| Quant::Gguf { quant_type: t.to_string() })
            .collect(),
    }
}

/// Every weight precision of [`quant_candidates`] probed, from the highest down; the first that
/// fits is the answer. Quantized weights of a full fine-tune train LoRA adapters ([`with_quant`]).
pub fn best_quant(question: &Question) -> Vec<QuantChoice> {
    let w = question.workload;
    let mut choices: Vec<QuantChoice> = Vec::new();
    let mut chosen = false;
    for quant in quant_candidates(question) {
        let (candidate, lora_rank) = with_quant(w, quant.clone());
        let (fit, refused) = match probe(question, question.hardware, &candidate) {
            Ok(fit) => (Some(fit), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let run = match &fit {
            Some(f) if f.fits && !chosen => {
                chosen = true;
                run_flags(question.model, question.hardware, w, &candidate, f)
            }
            _ => Vec::new(),
        };
        choices.push(QuantChoice { quant, lora_rank, fit, refused, run });
    }
    choices
}

/// One profile priced and probed by [`cheapest`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PricedProfile {
    /// The profile as given (`t4x2`, `4xa100-80gb`).
    pub hardware: String,
    /// GPUs in it.
    pub gpus: u64,
    /// Dollars per hour for all its GPUs; `None` where a GPU has no price.
    pub per_hour: Option<f64>,
    /// Its probe; `None` where the runtime refuses it there (`refused` says why).
    pub fit: Option<Fit>,
    /// Why it cannot run there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// Every profile tried, cheapest first among those that fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cheapest {
    /// The profiles that fit, by price per hour (unpriced last), then those that do not.
    pub profiles: Vec<PricedProfile>,
    /// The cheapest that fits, when one is priced.
    pub answer: Option<String>,
    /// What to type to run it.
    pub run: Vec<RunFlags>,
}

/// Probes the workload on each of `profiles` (specs as `--hardware` takes them) and prices
/// them with `prices`.
pub fn cheapest(question: &Question, profiles: &[String], prices: &Prices) -> Result<Cheapest, InputError> {
    let mut rows: Vec<(PricedProfile, HardwareProfile)> = Vec::new();
    for spec in profiles {
        let h = hardware::load(spec)?;
        let (fit, refused) = match probe(question, &h, question.workload) {
            Ok(fit) => (Some(fit), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let row = PricedProfile {
            hardware: spec.clone(),
            gpus: h.devices.len() as u64,
            per_hour: prices.per_hour(&h),
            fit,
            refused,
        };
        rows.push((row, h));
    }
    // Those that fit first, priced before unpriced, by price; a stable sort keeps the list's
    // order among equals.
    let fits = |r: &PricedProfile| r.fit.as_ref().is_some_and(|f| f.fits);
    rows.sort_by(|(a, _), (b, _)| {
        (!fits(a), a.per_hour.is_none())
            .cmp(&(!fits(b), b.per_hour.is_none()))
            .then(a.per_hour.unwrap_or(0.0).total_cmp(&b.per_hour.unwrap_or(0.0)))
    });
    let best = rows.first().filter(|(r, _)| fits(r) && r.per_hour.is_some());
    let run = match best {
        Some((PricedProfile { fit: Some(fit), .. }, h)) => {
            run_flags(question.model, h, question.workload, question.workload, fit)
        }
        _ => Vec::new(),
    };
    let answer = best.map(|(r, _)| r.hardware.clone());
    Ok(Cheapest { profiles: rows.into_iter().map(|(r, _)| r).collect(), answer, run })
}

#[cfg(test)]
mod shape_tests {
    use super::vllm_shape;

    /// The largest tensor-parallel size up to 8 that divides the heads and the count, the rest
    /// in pipeline stages (vLLM's multi-node guide: TP 8 × PP 2 for two 8-GPU nodes).
    #[test]
    fn vllm_shapes_keep_tensor_parallel_inside_a_server() {
        // Llama-3.1-405B: 128 heads, 8 KV heads, MLP 53248, 126 layers.
        let llama = |tp: u64| 128 % tp == 0 && (8 % tp == 0 || tp.is_multiple_of(8)) && 53248 % tp == 0;
        assert_eq!(vllm_shape(126, 16, llama), Some((8, 2)));
        assert_eq!(vllm_shape(126, 12, llama), Some((4, 3)));
        assert_eq!(vllm_shape(126, 4, llama), Some((4, 1)));
        // Qwen2.5-14B: 40 heads, 8 KV heads, MLP 13824, 48 layers: 5 divides the heads, not the
        // KV heads (vLLM asserts `total_num_kv_heads % tp == 0` or the converse).
        let qwen = |tp: u64| 40 % tp == 0 && (8 % tp == 0 || tp.is_multiple_of(8)) && 13824 % tp == 0;
        assert_eq!(vllm_shape(48, 5, qwen), Some((1, 5)));
        assert_eq!(vllm_shape(48, 10, qwen), Some((2, 5)));
        assert_eq!(vllm_shape(48, 20, qwen), Some((4, 5)));
        assert_eq!(vllm_shape(2, 3, |_| true), Some((3, 1)));
        assert_eq!(vllm_shape(2, 3, |tp| tp == 1), None, "3 stages for 2 layers");
    }
}
