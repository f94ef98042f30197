//! accelerate's `device_map="auto"` reproduced: every expected figure below is worked out by
//! hand from the algorithm's documented rules (`get_balanced_memory`, `infer_auto_device_map`,
//! `clean_device_map`, the bitsandbytes quantizer's sizes and its × 0.9), with the arithmetic
//! in the comments; none is copied from the code's output.
//!
//! Shared facts:
//! - A T4 in the profiles: nvidia-smi 15360 MiB, driver reserve 443 MiB, CUDA context 400 MB,
//!   so `mem_get_info` reports 16106127360 − 464519168 − 400000000 = 15241608192 bytes free.
//! - A profile without host RAM is given 64 GiB = 68719476736 bytes.
//! - Llama-2-7B (hidden 4096, intermediate 11008, 32 layers, vocab 32000), fp16: a decoder
//!   layer has 4·4096² + 3·4096·11008 + 2·4096 = 202383360 parameters = 404766720 bytes; the
//!   embedding and the head 32000·4096 = 131072000 parameters = 262144000 bytes each; the final
//!   norm 8192 bytes; the rotary module two fp32 buffers of 64 = 512 bytes. Total
//!   32·404766720 + 2·262144000 + 8192 + 512 = 13476831744 bytes. Modules holding tensors
//!   ("leaves"): the embedding, 9 per layer (7 linears, 2 norms), the norm, the rotary module,
//!   the head = 292.

use vramplan_profiles::DType;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Module, ModuleKind, Tensor};
use vramplan_sim::workload::{Quant, Workload};
use vramplan_solver::Tier;
use vramplan_solver::greedy::{
    self, GreedyQuant, MaxMemory, Options, Sizing, Strategy, auto_device_map, infer_auto_device_map,
};

const T4_FREE: u64 = 16106127360 - 464519168 - 400000000;
const DEFAULT_RAM: u64 = 64 << 30;

fn load(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("built-in model")
}

fn profile(name: &str) -> HardwareProfile {
    hardware::load(name).expect("built-in profile")
}

fn gpu(i: u32) -> Tier {
    Tier::Gpu(i)
}

/// The map `from_pretrained(device_map="auto")` would build for `workload`.
fn auto(
    model: &ModelDescription,
    hw: &HardwareProfile,
    workload: &Workload,
) -> (Vec<MaxMemory>, Vec<(String, Tier)>) {
    let sizing = Sizing::of(model, workload);
    let budgets = greedy::max_memory(hw, &sizing, Strategy::Balanced, Some(model));
    let map = auto_device_map(model, &sizing, &budgets);
    (budgets, map)
}

/// `(name, device)` for `model.layers.{range}`.
fn layers(range: std::ops::Range<u32>, tier: Tier) -> Vec<(String, Tier)> {
    range.map(|i| (format!("model.layers.{i}"), tier)).collect()
}

fn entry(name: &str, tier: Tier) -> (String, Tier) {
    (name.to_string(), tier)
}

fn nf4(w: Workload) -> Workload {
    Workload { quant: Quant::Nf4 { double_quant: true }, ..w }
}

#[test]
fn t4_free_memory_matches_the_profile() {
    let hw = profile("t4x2");
    assert!(hw.devices.iter().all(|d| d.usable_bytes() == T4_FREE));
    assert_eq!(T4_FREE, 15241608192);
}

/// Llama-2-7B fp16 on two T4s, `device_map="auto"`.
///
/// Caps: total ÷ 2 = 6738415872; the first LlamaDecoderLayer is 404766720 bytes, the mean leaf
/// 13476831744 ÷ 292 = 46153533, so the buffer is ⌊1.25 · 404766720⌋ = 505958400 and GPU 0's
/// cap 7244374272; GPU 1, the last, keeps all 15241608192.
///
/// Fill: GPU 0 keeps the largest layer (404766720) free, so 7244374272 − 404766720 =
/// 6839607552 for modules: the embedding (262144000) and 16 layers (262144000 + 16·404766720 =
/// 6738411520; a 17th would make 7143178240). Without the reservation 17 would fit
/// (7143178240 ≤ 7244374272). GPU 1 takes layers 16-31, the norm, the rotary buffers and the head.
#[test]
fn llama_2_7b_fp16_on_two_t4_stops_gpu0_after_16_layers() {
    let model = load("llama-2-7b");
    let (budgets, map) = auto(&model, &profile("t4x2"), &Workload::default());
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 7244374272 },
            MaxMemory { tier: gpu(1), bytes: 15241608192 },
            MaxMemory { tier: Tier::Cpu, bytes: DEFAULT_RAM },
        ]
    );
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..16, gpu(0)));
    expected.extend(layers(16..32, gpu(1)));
    expected.extend([
        entry("model.norm", gpu(1)),
        entry("model.rotary_emb", gpu(1)),
        entry("lm_head", gpu(1)),
    ]);
    assert_eq!(map, expected);
}

/// Without balancing every GPU keeps its free memory, and Llama-2-7B fits on GPU 0 alone.
/// Taking `model` off the list takes every decoder layer with it, so the largest layer left to
/// reserve is the head (262144000): `model` (13214687744) fits in 15241608192 − 262144000; then
/// nothing is left to reserve and the head fits too (13476831744 ≤ 15241608192). Uncleaned the
/// map is `model` and `lm_head` on GPU 0; cleaned, `{"": 0}`.
#[test]
fn sequential_fills_gpu0_and_cleans_to_one_entry() {
    let model = load("llama-2-7b");
    let hw = profile("t4x2");
    let sizing = Sizing::of(&model, &Workload::default());
    let budgets = greedy::max_memory(&hw, &sizing, Strategy::Sequential, Some(&model));
    assert_eq!(budgets[0].bytes, T4_FREE);
    assert_eq!(budgets[1].bytes, T4_FREE);
    assert_eq!(auto_device_map(&model, &sizing, &budgets), vec![entry("", gpu(0))]);
    let raw = Options { fallback_allocation: false, clean_result: false };
    let uncleaned = infer_auto_device_map(&model, &sizing, &budgets, raw);
    assert_eq!(uncleaned, vec![entry("model", gpu(0)), entry("lm_head", gpu(0))]);
}

/// `balanced_low_0` on two T4s: the cap is total ÷ (2 − 1) + 505958400, GPU 0 is left with
/// max(0, 13476831744 − 15241608192) = 0, and the whole model lands on GPU 1.
#[test]
fn balanced_low_0_leaves_gpu0_empty_when_gpu1_holds_everything() {
    let model = load("llama-2-7b");
    let hw = profile("t4x2");
    let sizing = Sizing::of(&model, &Workload::default());
    let budgets = greedy::max_memory(&hw, &sizing, Strategy::BalancedLow0, Some(&model));
    assert_eq!(budgets[0], MaxMemory { tier: gpu(0), bytes: 0 });
    assert_eq!(budgets[1], MaxMemory { tier: gpu(1), bytes: T4_FREE });
    assert_eq!(auto_device_map(&model, &sizing, &budgets), vec![entry("", gpu(1))]);
}

/// Llama-2-13B fp16 (hidden 5120, intermediate 13824, 40 layers): a layer is
/// 4·5120² + 3·5120·13824 + 2·5120 = 317204480 parameters = 634408960 bytes, the embedding and
/// head 32000·5120·2 = 327680000 bytes each.
///
/// One T4: a lone GPU gets 90 % of its free memory, ⌊0.9 · 15241608192⌋ = 13717447372, and no
/// cap. GPU 0 keeps 634408960 free: 13083038412 holds the embedding and 20 layers
/// (327680000 + 20·634408960 = 13015859200; a 21st makes 13650268160).
fn llama_2_13b_on_one_t4(ram: Option<u64>) -> Vec<(String, Tier)> {
    let model = load("llama-2-13b");
    let mut hw = profile("t4");
    hw.nodes[0].host.ram_bytes = ram;
    let (budgets, map) = auto(&model, &hw, &Workload::default());
    assert_eq!(budgets[0], MaxMemory { tier: gpu(0), bytes: 13717447372 });
    assert_eq!(budgets[1], MaxMemory { tier: Tier::Cpu, bytes: ram.unwrap_or(DEFAULT_RAM) });
    map
}

/// With 32 GB of RAM the rest goes to the CPU: layers 20-39, the norm, the rotary buffers and
/// the head (12688179200 + … ≪ 32e9 − 634408960).
#[test]
fn llama_2_13b_on_one_t4_offloads_the_rest_to_cpu() {
    let map = llama_2_13b_on_one_t4(Some(32_000_000_000));
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..20, gpu(0)));
    expected.extend(layers(20..40, Tier::Cpu));
    expected.extend([
        entry("model.norm", Tier::Cpu),
        entry("model.rotary_emb", Tier::Cpu),
        entry("lm_head", Tier::Cpu),
    ]);
    assert_eq!(map, expected);
}

/// Colab's 12.7 GB: the CPU also keeps the largest layer free, 12700000000 − 634408960 =
/// 12065591040, which holds 19 layers (20-38: 12053770240). Taking layer 39 leaves the head as
/// the largest layer (327680000), so the CPU's room is 12372320000, and layer 39 (making
/// 12688179200) goes to the disk, which has no cap, with everything after it.
#[test]
fn llama_2_13b_on_colab_spills_to_an_uncapped_disk() {
    let map = llama_2_13b_on_one_t4(Some(12_700_000_000));
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..20, gpu(0)));
    expected.extend(layers(20..39, Tier::Cpu));
    expected.extend([
        entry("model.layers.39", Tier::Disk),
        entry("model.norm", Tier::Disk),
        entry("model.rotary_emb", Tier::Disk),
        entry("lm_head", Tier::Disk),
    ]);
    assert_eq!(map, expected);
}

/// Gemma-2B (bf16, 18 layers, vocab 256000, hidden 2048) ties `lm_head.weight` to the input
/// embedding (256000·2048·2 = 1048576000 bytes, plus a 2-byte `embed_scale` buffer). A layer:
/// q 2048·2048, k and v 256·2048, o 2048·2048, MLP 3·2048·16384, two norms 2048 → 110104576
/// parameters = 220209152 bytes. Total 1048576002 + 18·220209152 + 4096 (norm) + 1024 (rotary,
/// two fp32 buffers of 128) = 5012345858; the tied head counts nothing and is no leaf, so 165
/// leaves (embedding, 9 per layer, norm, rotary), mean 30377853.
///
/// Cap on GPU 0: 5012345858 ÷ 2 + ⌊1.25 · 220209152⌋ = 2506172929 + 275261440 = 2781434369.
/// Once the embedding is taken the largest layer left is a decoder layer, so GPU 0 has
/// 2781434369 − 220209152 = 2561225217 for modules: the embedding, and with it the head it is
/// tied to, then 6 layers (1048576002 + 6·220209152 = 2369830914; a 7th makes 2590040066).
#[test]
fn tied_head_goes_with_the_embedding() {
    let model = load("gemma-2b");
    assert_eq!(
        model.tied_groups(),
        vec![vec!["model.embed_tokens.weight".to_string(), "lm_head.weight".into()]]
    );
    let (budgets, map) = auto(&model, &profile("t4x2"), &Workload::default());
    assert_eq!(budgets[0].bytes, 2781434369);
    let mut expected = vec![entry("model.embed_tokens", gpu(0)), entry("lm_head", gpu(0))];
    expected.extend(layers(0..6, gpu(0)));
    expected.extend(layers(6..18, gpu(1)));
    expected.extend([entry("model.norm", gpu(1)), entry("model.rotary_emb", gpu(1))]);
    assert_eq!(map, expected);
}

/// bitsandbytes sizes the weights it quantizes at its element size (4-bit: half a byte,
/// 8-bit: one byte) and keeps the head and the embeddings in fp16; then every budget is
/// multiplied by 0.9.
///
/// Llama-2-7B 4-bit: a layer is 202375168 linear weights · 0.5 + 2 norms · 8192 = 101203968
/// bytes; total 32·101203968 + 2·262144000 + 8192 + 512 = 3762823680; mean leaf
/// ⌊3762823680 ÷ 292⌋ = 12886382. Cap on GPU 0: 1881411840 + ⌊1.25 · 101203968⌋ = 2007916800,
/// × 0.9 = 1807125120; GPU 1 ⌊0.9 · 15241608192⌋ = 13717447372; the CPU ⌊0.9 · 64 GiB⌋ =
/// 61847529062.
///
/// The largest layers are now the fp16 embedding and head (262144000): GPU 0 has
/// 1807125120 − 262144000 = 1544981120 for the embedding and 12 layers (262144000 +
/// 12·101203968 = 1476591616; a 13th makes 1577795584). The head goes last, to GPU 1.
#[test]
fn bnb_4bit_sizes_linear_weights_at_half_a_byte_and_keeps_the_head() {
    let model = load("llama-2-7b");
    let workload = nf4(Workload::default());
    assert_eq!(Sizing::of(&model, &workload), Sizing { dtype: DType::F16, quant: GreedyQuant::Int4 });
    let (budgets, map) = auto(&model, &profile("t4x2"), &workload);
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 1807125120 },
            MaxMemory { tier: gpu(1), bytes: 13717447372 },
            MaxMemory { tier: Tier::Cpu, bytes: 61847529062 },
        ]
    );
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..12, gpu(0)));
    expected.extend(layers(12..32, gpu(1)));
    expected.extend([
        entry("model.norm", gpu(1)),
        entry("model.rotary_emb", gpu(1)),
        entry("lm_head", gpu(1)),
    ]);
    assert_eq!(map, expected);
}

/// 8-bit: a layer is 202375168 + 16384 = 202391552 bytes, total 32·202391552 + 524296704 =
/// 7000826368, mean leaf 23975432; GPU 0's cap 3500413184 + ⌊1.25 · 202391552⌋ = 3753402624,
/// × 0.9 = 3378062361 (⌊3378062361.6⌋).
#[test]
fn bnb_8bit_sizes_linear_weights_at_one_byte() {
    let model = load("llama-2-7b");
    let workload = Workload { quant: Quant::Int8, ..Workload::default() };
    let sizing = Sizing::of(&model, &workload);
    assert_eq!(sizing.quant, GreedyQuant::Int8);
    let budgets = greedy::max_memory(&profile("t4x2"), &sizing, Strategy::Balanced, Some(&model));
    assert_eq!(budgets[0].bytes, 3378062361);
}

/// The quantizer's 0.9 comes on top of the lone GPU's 0.9: ⌊0.9 · 0.9 · 15241608192⌋ =
/// ⌊12345702635.52⌋; the CPU ⌊0.9 · 12.7e9⌋ = 11430000000.
#[test]
fn one_gpu_under_bnb_keeps_81_percent() {
    let model = load("llama-2-7b");
    let sizing = Sizing::of(&model, &nf4(Workload::default()));
    let budgets = greedy::max_memory(&profile("t4"), &sizing, Strategy::Balanced, Some(&model));
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 12345702635 },
            MaxMemory { tier: Tier::Cpu, bytes: 11430000000 }
        ]
    );
}

/// The reported case: Mixtral-8x7B, 4-bit, on Kaggle's two T4s (transformers 5.x names: fused
/// experts `mlp.experts.gate_up_proj` [8, 28672, 4096] and `down_proj` [8, 4096, 14336]).
///
/// A layer at 4-bit: attention (4096·4096·2 + 1024·4096·2)·0.5 = 20971520, experts
/// (939524096 + 469762048)·0.5 = 704643072, the router kept in bf16 8·4096·2 = 65536, two
/// norms 16384 → 725696512 bytes. Total 32·725696512 + 262144000 (embedding) + 262144000 (head,
/// kept) + 8192 + 512 = 23746585088; 260 leaves (8 per layer), mean 91333019.
///
/// Cap on GPU 0: 11873292544 + ⌊1.25 · 725696512⌋ = 12780413184, × 0.9 = 11502371865; GPU 1
/// 13717447372. GPU 0 keeps a layer free: 10776675353 holds the embedding and 14 layers
/// (262144000 + 14·725696512 = 10421895168; a 15th makes 11147591680). GPU 1 takes the
/// other 18 (13062537216), the norm, rotary buffers and the head (13324689920 ≤ 13717447372).
#[test]
fn mixtral_8x7b_4bit_on_t4x2() {
    let model = load("mixtral-8x7b");
    let (budgets, map) = auto(&model, &profile("t4x2"), &nf4(Workload::default()));
    println!("max_memory: {budgets:?}");
    for (name, tier) in &map {
        println!("  {name:<24} {tier}");
    }
    assert_eq!(budgets[0].bytes, 11502371865);
    assert_eq!(budgets[1].bytes, 13717447372);
    let on = |tier: Tier| map.iter().filter(|(n, t)| *t == tier && n.starts_with("model.layers.")).count();
    assert_eq!(on(gpu(0)), 14);
    assert_eq!(on(gpu(1)), 18);
    assert!(map.contains(&entry("lm_head", gpu(1))));
    assert!(map.iter().all(|(_, t)| matches!(t, Tier::Gpu(_))), "nothing offloaded");
}

// ---------------------------------------------------------------------------------------------
// Small hand-made trees: uint8 parameters, so a tensor's bytes are its element count.

fn leaf(path: &str, bytes: u64) -> Module {
    Module::new(path, "Linear", ModuleKind::Linear).with_tensor(Tensor::parameter(
        "weight",
        &[bytes],
        DType::U8,
    ))
}

fn container(path: &str, class: &str, children: Vec<Module>) -> Module {
    Module::new(path, class, ModuleKind::Container).with_children(children)
}

/// A description with this tree and these no-split classes (the rest of the facts unused).
fn toy(root: Module, no_split: &[&str]) -> ModelDescription {
    let mut model = load("tinyllama-1.1b");
    model.root = root;
    model.facts.no_split_classes = no_split.iter().map(|s| s.to_string()).collect();
    model
}

const TOY_SIZING: Sizing = Sizing { dtype: DType::F32, quant: GreedyQuant::None };

fn budgets(gpu0: u64, gpu1: u64) -> Vec<MaxMemory> {
    vec![
        MaxMemory { tier: gpu(0), bytes: gpu0 },
        MaxMemory { tier: gpu(1), bytes: gpu1 },
        MaxMemory { tier: Tier::Cpu, bytes: 1000 },
    ]
}

/// `first` (a splittable `Pair` of two 70-byte leaves) and `second` (50); GPU 0 has 180.
/// Taking `first` off the list leaves `second` as the largest layer (50): room 130, and
/// `first` (140) is split. Then the largest layers are `p` and `q` (70): `p` fits (70 ≤ 110);
/// taking `q` leaves `second` (50) to reserve, room 130, and `q` would make 140, so it goes to
/// GPU 1, and `second` with it, although GPU 0 had room for it (120): the fill never returns.
#[test]
fn a_module_that_does_not_fit_is_split_and_the_fill_never_returns() {
    let tree = || {
        container(
            "",
            "Toy",
            vec![
                container("first", "Pair", vec![leaf("first.p", 70), leaf("first.q", 70)]),
                leaf("second", 50),
            ],
        )
    };
    let map = auto_device_map(&toy(tree(), &[]), &TOY_SIZING, &budgets(180, 1000));
    assert_eq!(map, vec![entry("first.p", gpu(0)), entry("first.q", gpu(1)), entry("second", gpu(1))]);

    // As a no-split class `first` (140 > 130) moves whole to GPU 1, and all of it cleans to "".
    let map = auto_device_map(&toy(tree(), &["Pair"]), &TOY_SIZING, &budgets(180, 1000));
    assert_eq!(map, vec![entry("", gpu(1))]);
}

/// `emb` (100) is tied to `head.proj.weight`; `head` also holds `head.extra` (80). GPU 0: 250,
/// largest layer 100 (`emb`, `body.l0`, `body.l1`), so 150. `emb` with the `head` it is tied
/// to makes 100 + 80 = 180: too much, but `emb` alone fits, so `head` is split; `emb` with
/// `head.proj` (0, the tied copy is not counted) fits, and both go to GPU 0. Taking `body`
/// leaves `head.extra` (80) to reserve: room 170 < 100 + 200, so `body` is split; `body.l0`
/// (largest 100 again, room 150) would make 200 and moves the fill to GPU 1. After cleaning,
/// `body`'s two layers merge into `body`.
#[test]
fn tied_parameters_move_together_and_a_tied_module_is_split_to_fit() {
    let head = container(
        "head",
        "HeadBox",
        vec![
            Module::new("head.proj", "Linear", ModuleKind::Linear).with_tensor(Tensor {
                tied_to: Some("emb.weight".into()),
                ..Tensor::parameter("weight", &[100], DType::U8)
            }),
            leaf("head.extra", 80),
        ],
    );
    let root = container(
        "",
        "Toy",
        vec![
            leaf("emb", 100),
            container("body", "Body", vec![leaf("body.l0", 100), leaf("body.l1", 100)]),
            head,
        ],
    );
    let map = auto_device_map(&toy(root, &[]), &TOY_SIZING, &budgets(250, 1000));
    assert_eq!(
        map,
        vec![
            entry("emb", gpu(0)),
            entry("head.proj", gpu(0)),
            entry("body", gpu(1)),
            entry("head.extra", gpu(1))
        ]
    );
}

/// `big` (a 300-byte no-split block), then `mid` (a container of 40 and 90), then `tail`
/// (100). GPU 0 has 350. Taking `big` leaves `tail` (100) as the largest layer: room 250, and
/// `big` does not fit, so GPU 0 stays empty and everything lands on GPU 1.
/// With fallback allocation GPU 0's room is 350 − max(100, 300) = 50; the search splits `mid`
/// (130), finds `mid.x` (40), and puts it on GPU 0 before `big` moves on.
#[test]
fn fallback_allocation_fills_a_device_that_would_stay_empty() {
    let tree = || {
        let big = Module::new("big", "Big", ModuleKind::Block).with_tensor(Tensor::parameter(
            "weight",
            &[300],
            DType::U8,
        ));
        container(
            "",
            "Toy",
            vec![big, container("mid", "Mid", vec![leaf("mid.x", 40), leaf("mid.y", 90)]), leaf("tail", 100)],
        )
    };
    let model = toy(tree(), &["Big"]);
    let plain = auto_device_map(&model, &TOY_SIZING, &budgets(350, 1000));
    assert_eq!(plain, vec![entry("", gpu(1))]);
    let options = Options { fallback_allocation: true, clean_result: true };
    let fallback = infer_auto_device_map(&model, &TOY_SIZING, &budgets(350, 1000), options);
    assert_eq!(
        fallback,
        vec![entry("mid.x", gpu(0)), entry("big", gpu(1)), entry("mid.y", gpu(1)), entry("tail", gpu(1))]
    );
}

/// Taking a module off the list takes its descendants off the largest-layer list too: `box`
/// (leaves `a` and `b`, 100 each) then `c` (10), GPU 0 with 215. The largest layers are `a`
/// and `b`; once `box` is taken they are gone, the largest layer left is `c` (10), and `box`
/// (200 ≤ 215 − 10) is placed whole; then `c` (210 ≤ 215, nothing left to reserve). Had `a`
/// and `b` stayed reserved (room 115), `box` would have been split. Uncleaned map: `box`, `c`.
#[test]
fn the_reservation_forgets_the_layers_of_a_module_being_placed() {
    let root = container(
        "",
        "Toy",
        vec![container("box", "Box", vec![leaf("box.a", 100), leaf("box.b", 100)]), leaf("c", 10)],
    );
    let options = Options { fallback_allocation: false, clean_result: false };
    let map = infer_auto_device_map(&toy(root, &[]), &TOY_SIZING, &budgets(215, 1000), options);
    assert_eq!(map, vec![entry("box", gpu(0)), entry("c", gpu(0))]);
}
