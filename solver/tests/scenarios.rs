//! The scenario suite: model × hardware × workload cases, dense and MoE, training and
//! inference, on equal and mixed GPUs. For each, the ILP plan and accelerate's greedy map are
//! both simulated step by step; the ILP must fit wherever greedy fits, and its fullest GPU must
//! never be fuller than greedy's. The table is printed (`cargo test -- --nocapture`).

use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Optimizer, Quant, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::plan::{Plan, Settings, SolverKind, plan};

struct Case {
    model: &'static str,
    hardware: &'static str,
    workload: Workload,
    /// The transformers layout the user runs (4.x for the reports made with it).
    runtime: Runtime,
}

fn infer(batch: u64, seq: u64) -> Workload {
    Workload { mode: Mode::Inference, batch, seq, ..Workload::default() }
}

fn half(w: Workload) -> Workload {
    Workload { weight_dtype: Some(vramplan_profiles::DType::F16), ..w }
}

fn nf4(w: Workload) -> Workload {
    Workload { quant: Quant::Nf4 { double_quant: true }, ..w }
}

fn train(batch: u64, seq: u64) -> Workload {
    Workload {
        mode: Mode::Train,
        batch,
        seq,
        grad_checkpointing: GradCheckpointing::Full,
        ..Workload::default()
    }
}

fn lora(w: Workload) -> Workload {
    Workload { finetune: Finetune::Lora { rank: 16, alpha: 32, targets: Vec::new() }, ..w }
}

fn cases() -> Vec<Case> {
    let c = |model, hardware, workload| Case { model, hardware, workload, runtime: Runtime::Accelerate };
    // Mixtral in 4-bit as reported (accelerate #3041), with transformers 4.x: 5.x leaves its
    // fused experts in 16 bits (bitsandbytes quantizes `nn.Linear` only), far past two T4s.
    let v4 = |model, hardware, workload| Case { model, hardware, workload, runtime: Runtime::AccelerateV4 };
    vec![
        v4("mixtral-8x7b", "t4x2", half(nf4(infer(1, 1024)))),
        c("llama-2-7b", "t4x2", half(infer(8, 2048))),
        c("llama-2-13b", "t4x2", half(infer(1, 4096))),
        c("llama-3-8b", "2xrtx4090", infer(16, 4096)),
        c("llama-2-70b", "a100-40gb-x4", half(infer(4, 4096))),
        c("llama-2-70b", "rtx4090-x4", nf4(half(infer(4, 4096)))),
        c("qwen2.5-14b", "rtx4090+rtx3090", infer(4, 8192)),
        c("mixtral-8x7b", "a100-80gb-x4", infer(32, 4096)),
        c("qwen3-30b-a3b", "2xa100-40gb", infer(8, 8192)),
        c("deepseek-v2-lite", "2xl4", infer(4, 4096)),
        c("olmoe-1b-7b", "t4x2", half(infer(16, 4096))),
        c("phi-3-mini", "t4x2", half(infer(8, 4096))),
        c("llama-3-70b", "2xa100-40gb", nf4(infer(8, 8192))),
        c("codellama-34b", "a100-40gb-x4", half(infer(8, 16384))),
        c("llama-2-13b", "t4x2", half(infer(4, 4096))),
        v4("mixtral-8x7b", "t4x2", half(nf4(infer(4, 4096)))),
        c("pythia-2.8b", "t4x2", lora(half(train(2, 2048)))),
        c("llama-2-7b", "a100-40gb-x4", train(4, 2048)),
        c("llama-3-8b", "2xrtx4090", lora(train(1, 2048))),
        c("mistral-7b", "t4x2", lora(nf4(half(train(2, 2048))))),
        c("gemma-2-9b", "rtx4090+rtx3090", lora(train(1, 2048))),
        c("qwen2.5-7b", "a100-80gb-x4", Workload { optimizer: Optimizer::Adamw8bit, ..train(2, 4096) }),
        v4("mixtral-8x7b", "2xa100-40gb", lora(nf4(train(1, 4096)))),
        c("gpt2", "t4x2", Workload { grad_checkpointing: GradCheckpointing::Off, ..train(4, 1024) }),
    ]
}

/// The fullest GPU's peak reserved over usable memory, from the simulation.
fn worst(plan: &Plan) -> f64 {
    plan.devices.iter().filter(|d| d.estimate.is_some()).map(|d| d.utilisation).fold(0.0, f64::max)
}

/// Plans `case` with `solver`, each GPU's simulated peak kept within usable × (1 − headroom).
fn solve(case: &Case, solver: SolverKind, headroom: f64) -> Plan {
    let model = model::load(case.model, ImportOptions { naming: case.runtime.naming() }).unwrap();
    let hardware = hardware::load(case.hardware).unwrap();
    let mut request = Request::new(case.runtime);
    request.headroom = headroom;
    let settings = Settings { solver, ..Settings::default() };
    plan(&model, &hardware, &case.workload, &request, &settings)
        .unwrap_or_else(|e| panic!("{} on {}: {e}", case.model, case.hardware))
}

#[test]
fn ilp_fits_where_greedy_fits_and_is_never_fuller() {
    let cases = cases();
    assert!(cases.len() >= 20);
    println!(
        "{:<16} {:<16} {:<9} {:>7} {:>6} | {:>7} {:>6}",
        "model", "hardware", "mode", "greedy", "fits", "ilp", "fits"
    );
    let mut ilp_only = 0;
    let mut failures = Vec::new();
    for case in &cases {
        // One bar for both: does the simulated step fit the GPUs' usable memory (no headroom,
        // which accelerate does not know).
        let greedy = solve(case, SolverKind::Greedy, 0.0);
        let ilp = solve(case, SolverKind::Ilp, 0.0);
        println!(
            "{:<16} {:<16} {:<9} {:>6.1}% {:>6} | {:>6.1}% {:>6}",
            case.model,
            case.hardware,
            format!("{:?}", case.workload.mode).to_lowercase(),
            100.0 * worst(&greedy),
            greedy.feasible,
            100.0 * worst(&ilp),
            ilp.feasible
        );
        if greedy.feasible && !ilp.feasible {
            failures.push(format!("{} on {}: greedy fits, ILP does not", case.model, case.hardware));
        }
        if ilp.feasible && greedy.feasible && worst(&ilp) > worst(&greedy) + 1e-9 {
            failures.push(format!(
                "{} on {}: ILP's fullest GPU {:.2}% above greedy's {:.2}%",
                case.model,
                case.hardware,
                100.0 * worst(&ilp),
                100.0 * worst(&greedy)
            ));
        }
        if ilp.feasible && !greedy.feasible {
            ilp_only += 1;
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(ilp_only >= 1, "the suite should hold cases only the ILP fits");
}

#[test]
fn mixtral_4bit_on_two_t4s_is_balanced_within_headroom() {
    // The reported case (accelerate #3041, transformers #46823): Mixtral-8x7B in 4-bit on two
    // 16 GB T4s.
    let case = &cases()[0];
    let ilp = solve(case, SolverKind::Ilp, 0.10);
    let greedy = solve(case, SolverKind::Greedy, 0.10);
    println!("ILP map: {:?}", ilp.device_map);
    println!("greedy map: {:?}", greedy.device_map);
    assert!(ilp.feasible);
    let peaks: Vec<u64> =
        ilp.devices.iter().filter_map(|d| d.estimate.as_ref().map(|e| e.peak_reserved_bytes)).collect();
    assert_eq!(peaks.len(), 2, "both GPUs used");
    for d in &ilp.devices {
        let e = d.estimate.as_ref().unwrap();
        // Within 10 % headroom: peak reserved ≤ 0.9 × usable.
        assert!(
            e.peak_reserved_bytes as f64 <= 0.9 * e.usable_bytes as f64,
            "{}: {}",
            d.name,
            e.peak_reserved_bytes
        );
    }
    let (lo, hi) = (*peaks.iter().min().unwrap() as f64, *peaks.iter().max().unwrap() as f64);
    assert!((hi - lo) / hi <= 0.05, "peaks {peaks:?} differ by more than 5 %");
}

/// The solver's charges and the replay are read off one step program, so the charges bound the
/// replay's live bytes and a plan needs a refinement round only where the plan offloads
/// (streaming weights onto the main GPU changes the program) or where the allocator's slack
/// takes the reserve past the limit. In a prefill, the hidden states handed from layer to layer
/// are allocated before each layer's working set, which holds tensors of that size and of the
/// MLP's: the first layer (whose input is the embeddings, already held) lays the segments out
/// one hidden state short, and later layers split an MLP-sized block for it (the allocator's
/// best fit), a slack of about one MLP tensor. Over the suite, at the default 10 % headroom
/// and at none: every plan without offload holds within two rounds, most in one, and none is
/// left without an answer.
#[test]
fn plans_without_offload_converge_within_two_rounds() {
    use vramplan_solver::plan::Verdict;
    let mut failures = Vec::new();
    let (mut one_round, mut two_rounds, mut with_offload, mut proven) = (0, 0, 0, 0);
    for case in &cases() {
        for headroom in [0.10, 0.0] {
            let plan = solve(case, SolverKind::Ilp, headroom);
            let what = format!("{} on {} (headroom {headroom})", case.model, case.hardware);
            match plan.verdict {
                Verdict::Unknown => failures.push(format!("{what}: no answer ({:?})", plan.unanswered)),
                Verdict::DoesNotFit => proven += 1,
                Verdict::Fits if plan.offloaded_bytes > 0 => with_offload += 1,
                Verdict::Fits if plan.solver.rounds == 1 => one_round += 1,
                Verdict::Fits if plan.solver.rounds == 2 => two_rounds += 1,
                Verdict::Fits => failures.push(format!("{what}: {} rounds", plan.solver.rounds)),
            }
        }
    }
    println!(
        "{one_round} plans without offload in one round, {two_rounds} in two; {with_offload} with offload; \
         {proven} proven not to fit"
    );
    // 43 in one round before prefills held what transformers' layers hold (the input
    // embeddings, the layer's input, the residual and the norm's output beside the MLP's
    // tensors): some large prefills now need offload, or do not fit.
    assert!(one_round >= 25, "only {one_round} plans without offload in one round");
    assert!(two_rounds <= 2, "{two_rounds} plans without offload needed two rounds");
    assert!(failures.is_empty(), "{failures:#?}");
}
