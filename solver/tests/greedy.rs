//! `device_map="auto"` reproduced, in both versions: every expected figure below is worked out
//! by hand from the rules read in the source (transformers 5.23 `integrations/accelerate.py`;
//! transformers 4.57 `modeling_utils._get_device_map` with accelerate 1.15 `utils/modeling.py`;
//! the bitsandbytes quantizers), with the arithmetic in the comments; none is copied from the
//! code's output. `baseline_reference.rs` checks the same code against the real libraries.
//!
//! Shared facts:
//! - A T4 in the profiles: nvidia-smi 15360 MiB, driver reserve 443 MiB, CUDA context 400 MB,
//!   so `mem_get_info` reports 16106127360 − 464519168 − 400000000 = 15241608192 bytes free.
//! - A profile without host RAM is given 64 GiB = 68719476736 bytes; 5.x keeps 90 % of it,
//!   ⌊68719476736 · 0.9⌋ = 61847529062 (and ⌊· 0.9 · 0.9⌋ = 55662776156 under bitsandbytes).
//! - Llama-2-7B (hidden 4096, intermediate 11008, 32 layers, vocab 32000), fp16: a decoder
//!   layer has 4·4096² + 3·4096·11008 + 2·4096 = 202383360 parameters = 404766720 bytes; the
//!   embedding and the head 32000·4096 = 131072000 parameters = 262144000 bytes each; the final
//!   norm 8192 bytes. The rotary module holds, with 5.x names, two fp32 buffers of 64 (`inv_freq`
//!   and `original_inv_freq`, 512 bytes), with 4.x names `inv_freq` alone, which accelerate sizes
//!   at min(fp16, fp32): 128 bytes. Modules holding tensors ("leaves"): the embedding, 9 per
//!   layer (7 linears, 2 norms), the norm, the rotary module, the head = 292.
//! - The buffer added to each capped GPU's share: 5.x ⌊1.25 · max(largest no-split module,
//!   largest leaf)⌋, 4.x ⌊1.25 · max(first module of each no-split class, mean leaf)⌋.

use vramplan_profiles::DType;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Module, ModuleKind, Naming, Tensor};
use vramplan_sim::workload::{Quant, Workload};
use vramplan_solver::greedy::{
    self, GreedyQuant, MaxMemory, Options, Sizing, Strategy, Version, auto_device_map, infer_auto_device_map,
};
use vramplan_solver::{Runtime, Target};

const T4_FREE: u64 = 16106127360 - 464519168 - 400000000;
const DEFAULT_RAM: u64 = 64 << 30;
/// ⌊0.9 · 64 GiB⌋: transformers 5.x's CPU budget without a user `max_memory`.
const DEFAULT_RAM_V5: u64 = 61847529062;

/// A built-in model with transformers 5.x names (its baseline follows 5.x).
fn load(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("built-in model")
}

/// A built-in model with transformers 4.x names (its baseline follows 4.x with accelerate).
fn load_v4(name: &str) -> ModelDescription {
    model::load(name, ImportOptions { naming: Naming::V4 }).expect("built-in model")
}

/// A profile by name. The T4 pairs below are `2xt4`: Kaggle's `t4x2` states its 29 GiB of RAM,
/// and these maps were worked out with the 64 GiB a profile without host figures is given.
fn profile(name: &str) -> HardwareProfile {
    hardware::load(name).expect("built-in profile")
}

fn gpu(i: u32) -> Target {
    Target::Gpu(i)
}

/// The map `from_pretrained(device_map="auto")` would build for `workload`, in the version the
/// model's naming follows.
fn auto(
    model: &ModelDescription,
    hw: &HardwareProfile,
    workload: &Workload,
) -> (Vec<MaxMemory>, Vec<(String, Target)>) {
    let sizing = Sizing::of(model, workload);
    let budgets = greedy::max_memory(hw, &sizing, Strategy::Balanced, Some(model));
    let map = auto_device_map(model, &sizing, &budgets);
    (budgets, map)
}

/// `(name, device)` for `model.layers.{range}`.
fn layers(range: std::ops::Range<u32>, tier: Target) -> Vec<(String, Target)> {
    range.map(|i| (format!("model.layers.{i}"), tier)).collect()
}

fn entry(name: &str, tier: Target) -> (String, Target) {
    (name.to_string(), tier)
}

fn nf4(w: Workload) -> Workload {
    Workload { quant: Quant::Nf4 { double_quant: true }, ..w }
}

#[test]
fn t4_free_memory_matches_the_profile() {
    let hw = profile("2xt4");
    assert!(hw.devices.iter().all(|d| d.usable_bytes() == T4_FREE));
    assert_eq!(T4_FREE, 15241608192);
}

/// The version follows the target: `accelerate-v4` is 4.x, `accelerate` 5.x, whatever names
/// the description was read with; other targets follow the names.
#[test]
fn the_target_picks_the_version() {
    let w = Workload::default();
    let v5 = load("llama-3.2-1b");
    let v4 = load_v4("llama-3.2-1b");
    assert_eq!(Sizing::of(&v5, &w).version, Version::Transformers5);
    assert_eq!(Sizing::of(&v4, &w).version, Version::Transformers4);
    assert_eq!(Sizing::for_target(&v5, &w, Runtime::AccelerateV4).version, Version::Transformers4);
    assert_eq!(Sizing::for_target(&v4, &w, Runtime::Accelerate).version, Version::Transformers5);
    assert_eq!(Sizing::for_target(&v4, &w, Runtime::Pipeline).version, Version::Transformers4);
}

/// Llama-2-7B fp16 on two T4s, `device_map="auto"`, transformers 5.x.
///
/// Caps: total 32·404766720 + 2·262144000 + 8192 + 512 = 13476831744, ÷ 2 = 6738415872; the
/// largest LlamaDecoderLayer (404766720) outweighs the largest leaf (the embedding or the head,
/// 262144000), so the buffer is ⌊1.25 · 404766720⌋ = 505958400 and GPU 0's cap 7244374272;
/// GPU 1, the last, keeps all 15241608192; the CPU 90 % of 64 GiB.
///
/// Fill: GPU 0 keeps the largest layer (404766720) free, so 7244374272 − 404766720 =
/// 6839607552 for modules: the embedding (262144000) and 16 layers (262144000 + 16·404766720 =
/// 6738411520; a 17th would make 7143178240). Without the reservation 17 would fit
/// (7143178240 ≤ 7244374272). GPU 1 takes layers 16-31, the norm, the rotary buffers and the head.
#[test]
fn llama_2_7b_fp16_on_two_t4_stops_gpu0_after_16_layers() {
    let model = load("llama-2-7b");
    let (budgets, map) = auto(&model, &profile("2xt4"), &Workload::default());
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 7244374272 },
            MaxMemory { tier: gpu(1), bytes: 15241608192 },
            MaxMemory { tier: Target::Cpu, bytes: DEFAULT_RAM_V5 },
        ]
    );
    assert_eq!(map, llama_2_7b_split_after(16));
}

fn llama_2_7b_split_after(n: u32) -> Vec<(String, Target)> {
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..n, gpu(0)));
    expected.extend(layers(n..32, gpu(1)));
    expected.extend([
        entry("model.norm", gpu(1)),
        entry("model.rotary_emb", gpu(1)),
        entry("lm_head", gpu(1)),
    ]);
    expected
}

/// The same under transformers 4.x (4.x names): the rotary module is 128 bytes, so the total is
/// 13476831360, ÷ 2 = 6738415680; the first decoder layer (404766720) outweighs the mean leaf
/// (⌊13476831360 ÷ 292⌋ = 46153531), so the cap is 6738415680 + 505958400 = 7244374080, and
/// the CPU keeps all 64 GiB. The fill is the same: 16 layers (6738411520 ≤ 7244374080 −
/// 404766720 = 6839607360 < 7143178240).
#[test]
fn llama_2_7b_fp16_on_two_t4_under_4x() {
    let model = load_v4("llama-2-7b");
    let (budgets, map) = auto(&model, &profile("2xt4"), &Workload::default());
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 7244374080 },
            MaxMemory { tier: gpu(1), bytes: 15241608192 },
            MaxMemory { tier: Target::Cpu, bytes: DEFAULT_RAM },
        ]
    );
    assert_eq!(map, llama_2_7b_split_after(16));
}

/// Without balancing every GPU keeps its free memory, and Llama-2-7B fits on GPU 0 alone.
/// Taking `model` off the list takes every decoder layer with it, so the largest layer left to
/// reserve is the head (262144000): `model` (13214687744) fits in 15241608192 − 262144000; then
/// nothing is left to reserve and the head fits too (13476831744 ≤ 15241608192). Uncleaned the
/// map is `model` and `lm_head` on GPU 0; cleaned, `{"": 0}`.
#[test]
fn sequential_fills_gpu0_and_cleans_to_one_entry() {
    let model = load("llama-2-7b");
    let hw = profile("2xt4");
    let sizing = Sizing::of(&model, &Workload::default());
    let budgets = greedy::max_memory(&hw, &sizing, Strategy::Sequential, Some(&model));
    assert_eq!(budgets[0].bytes, T4_FREE);
    assert_eq!(budgets[1].bytes, T4_FREE);
    assert_eq!(budgets[2].bytes, DEFAULT_RAM_V5);
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
    let hw = profile("2xt4");
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
/// (327680000 + 20·634408960 = 13015859200; a 21st makes 13650268160). The CPU gets the RAM
/// (4.x) or 90 % of it (5.x).
fn llama_2_13b_on_one_t4(model: &ModelDescription, ram: u64) -> Vec<(String, Target)> {
    let mut hw = profile("t4");
    hw.nodes[0].host.ram_bytes = Some(ram);
    let (budgets, map) = auto(model, &hw, &Workload::default());
    let cpu = match model.naming {
        Naming::V4 => ram,
        Naming::V5 => (ram as f64 * 0.9) as u64,
    };
    assert_eq!(budgets[0], MaxMemory { tier: gpu(0), bytes: 13717447372 });
    assert_eq!(budgets[1], MaxMemory { tier: Target::Cpu, bytes: cpu });
    map
}

/// `(layers on GPU 0, on the CPU, on the disk)` of Llama-2-13B's map; the norm, rotary buffers
/// and head follow the last layer.
fn llama_2_13b_map(cpu: std::ops::Range<u32>, disk: std::ops::Range<u32>) -> Vec<(String, Target)> {
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..20, gpu(0)));
    expected.extend(layers(cpu.clone(), Target::Cpu));
    expected.extend(layers(disk.clone(), Target::Disk));
    let rest = if disk.is_empty() { Target::Cpu } else { Target::Disk };
    expected.extend([entry("model.norm", rest), entry("model.rotary_emb", rest), entry("lm_head", rest)]);
    expected
}

/// With 32 GB of RAM (5.x: 28.8e9 for the CPU) the rest goes to the CPU: layers 20-39, the
/// norm, the rotary buffers and the head (12688179200 + … ≪ 28.8e9 − 634408960).
#[test]
fn llama_2_13b_on_one_t4_offloads_the_rest_to_cpu() {
    let map = llama_2_13b_on_one_t4(&load("llama-2-13b"), 32_000_000_000);
    assert_eq!(map, llama_2_13b_map(20..40, 40..40));
}

/// Colab's 12.7 GB under 4.x: the CPU also keeps the largest layer free, 12700000000 −
/// 634408960 = 12065591040, which holds 19 layers (20-38: 12053770240). Taking layer 39 leaves
/// the head as the largest layer (327680000), so the CPU's room is 12372320000, and layer 39
/// (making 12688179200) goes to the disk, which has no cap, with everything after it.
#[test]
fn llama_2_13b_on_colab_spills_to_an_uncapped_disk_under_4x() {
    let map = llama_2_13b_on_one_t4(&load_v4("llama-2-13b"), 12_700_000_000);
    assert_eq!(map, llama_2_13b_map(20..39, 39..40));
}

/// Colab under 5.x: the CPU gets ⌊0.9 · 12.7e9⌋ = 11430000000, less the layer kept free,
/// 10795591040: 17 layers (20-36: 10784952320); layer 37 would make 11419361280 with layers 38
/// and 39 still to reserve for, so 37-39 and the rest go to the disk.
#[test]
fn llama_2_13b_on_colab_spills_to_an_uncapped_disk() {
    let map = llama_2_13b_on_one_t4(&load("llama-2-13b"), 12_700_000_000);
    assert_eq!(map, llama_2_13b_map(20..37, 37..40));
}

/// Gemma-2B (bf16, 18 layers, vocab 256000, hidden 2048) ties `lm_head.weight` to the input
/// embedding (256000·2048·2 = 1048576000 bytes). A layer: q 2048·2048, k and v 256·2048, o
/// 2048·2048, MLP 3·2048·16384, two norms 2048 → 110104576 parameters = 220209152 bytes; the
/// norm 4096 bytes. The tied head counts nothing and is no leaf.
///
/// 5.x: the embedding module also holds a 2-byte `embed_scale` buffer (1048576002), the rotary
/// module two fp32 buffers of 128 (1024): total 1048576002 + 18·220209152 + 4096 + 1024 =
/// 5012345858. The largest leaf is the embedding, so the buffer is ⌊1.25 · 1048576002⌋ =
/// 1310720002 and GPU 0's cap 2506172929 + 1310720002 = 3816892931. Once the embedding is
/// taken the largest layer left is a decoder layer: 3816892931 − 220209152 = 3596683779 for
/// the embedding, the head tied to it (0), and 11 layers (1048576002 + 11·220209152 =
/// 3470876674; a 12th makes 3691085826).
#[test]
fn tied_head_goes_with_the_embedding() {
    let model = load("gemma-2b");
    assert_eq!(
        model.tied_groups(),
        vec![vec!["model.embed_tokens.weight".to_string(), "lm_head.weight".into()]]
    );
    let (budgets, map) = auto(&model, &profile("2xt4"), &Workload::default());
    assert_eq!(budgets[0].bytes, 3816892931);
    assert_eq!(map, gemma_2b_split_after(11));
}

fn gemma_2b_split_after(n: u32) -> Vec<(String, Target)> {
    let mut expected = vec![entry("model.embed_tokens", gpu(0)), entry("lm_head", gpu(0))];
    expected.extend(layers(0..n, gpu(0)));
    expected.extend(layers(n..18, gpu(1)));
    expected.extend([entry("model.norm", gpu(1)), entry("model.rotary_emb", gpu(1))]);
    expected
}

/// 4.x: no `embed_scale` buffer and one rotary buffer sized at bf16 (256): total 1048576000 +
/// 18·220209152 + 4096 + 256 = 5012345088; 165 leaves (embedding, 9 per layer, norm, rotary),
/// mean 30377849 < the first layer, so the cap is 2506172544 + ⌊1.25 · 220209152⌋ =
/// 2781433984, and 2781433984 − 220209152 = 2561224832 holds the embedding with the head and 6
/// layers (1048576000 + 6·220209152 = 2369830912; a 7th makes 2590040064).
#[test]
fn tied_head_goes_with_the_embedding_under_4x() {
    let model = load_v4("gemma-2b");
    let (budgets, map) = auto(&model, &profile("2xt4"), &Workload::default());
    assert_eq!(budgets[0].bytes, 2781433984);
    assert_eq!(map, gemma_2b_split_after(6));
}

/// bitsandbytes 4-bit under 5.x: `param_element_size` is 0.5 for the weight of each
/// `nn.Linear` it replaced, the tensor's own size for the rest (norms, the embedding, the head
/// it keeps); then every budget × 0.9.
///
/// Llama-2-7B: a layer is 202375168 linear weights · 0.5 + 2 norms · 8192 = 101203968 bytes;
/// total 32·101203968 + 2·262144000 + 8192 + 512 = 3762823680. The largest leaf, the fp16
/// embedding or head (262144000), outweighs a layer: cap on GPU 0 1881411840 + ⌊1.25 ·
/// 262144000⌋ = 2209091840, × 0.9 = 1988182656; GPU 1 ⌊0.9 · 15241608192⌋ = 13717447372; the
/// CPU ⌊0.9 · 0.9 · 64 GiB⌋ = 55662776156.
///
/// The largest layers are the embedding and the head (262144000): GPU 0 has 1988182656 −
/// 262144000 = 1726038656 for the embedding and 14 layers (262144000 + 14·101203968 =
/// 1678999552; a 15th makes 1780203520). The head goes last, to GPU 1.
#[test]
fn bnb_4bit_sizes_linear_weights_at_half_a_byte_and_keeps_the_head() {
    let model = load("llama-2-7b");
    let workload = nf4(Workload::default());
    assert_eq!(
        Sizing::of(&model, &workload),
        Sizing { dtype: DType::F16, quant: GreedyQuant::Int4, version: Version::Transformers5 }
    );
    let (budgets, map) = auto(&model, &profile("2xt4"), &workload);
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 1988182656 },
            MaxMemory { tier: gpu(1), bytes: 13717447372 },
            MaxMemory { tier: Target::Cpu, bytes: 55662776156 },
        ]
    );
    assert_eq!(map, llama_2_7b_split_after(14));
}

/// 4.x sizes every floating-point tensor at min(int4, its own) = half a byte, except the
/// `special_dtypes` (the parameters of `lm_head`, kept in fp16): a layer 202383360 · 0.5 =
/// 101191680, the embedding 65536000, the norm 2048, the rotary buffer 32, the head 262144000;
/// total 32·101191680 + 65536000 + 262144000 + 2080 = 3565815840. Cap on GPU 0: 1782907920 +
/// ⌊1.25 · 101191680⌋ = 1909397520, × 0.9 = 1718457768; the CPU ⌊0.9 · 64 GiB⌋.
///
/// The head is the largest layer: 1718457768 − 262144000 = 1456313768 holds the embedding and
/// 13 layers (65536000 + 13·101191680 = 1381027840; a 14th makes 1482219520).
#[test]
fn bnb_4bit_under_4x_sizes_everything_but_the_head_at_half_a_byte() {
    let model = load_v4("llama-2-7b");
    let (budgets, map) = auto(&model, &profile("2xt4"), &nf4(Workload::default()));
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 1718457768 },
            MaxMemory { tier: gpu(1), bytes: 13717447372 },
            MaxMemory { tier: Target::Cpu, bytes: DEFAULT_RAM_V5 },
        ]
    );
    assert_eq!(map, llama_2_7b_split_after(13));
}

/// 8-bit, 5.x: a layer is 202375168 + 16384 = 202391552 bytes, total 32·202391552 +
/// 524296704 = 7000826368; the buffer is still the head's ⌊1.25 · 262144000⌋ = 327680000, so
/// GPU 0's cap is 3500413184 + 327680000 = 3828093184, × 0.9 = 3445283865 (⌊…865.6⌋).
/// 4.x: everything but the head at one byte: a layer 202383360, total 32·202383360 +
/// 131072000 + 262144000 + 4096 + 64 = 6869487680; cap 3434743840 + ⌊1.25 · 202383360⌋ =
/// 3687723040, × 0.9 = 3318950736.
#[test]
fn bnb_8bit_sizes_linear_weights_at_one_byte() {
    let workload = Workload { quant: Quant::Int8, ..Workload::default() };
    for (model, cap) in [(load("llama-2-7b"), 3445283865), (load_v4("llama-2-7b"), 3318950736)] {
        let sizing = Sizing::of(&model, &workload);
        assert_eq!(sizing.quant, GreedyQuant::Int8);
        let budgets = greedy::max_memory(&profile("2xt4"), &sizing, Strategy::Balanced, Some(&model));
        assert_eq!(budgets[0].bytes, cap, "{:?}", sizing.version);
    }
}

/// The quantizer's 0.9 comes on top of the lone GPU's 0.9: ⌊0.9 · 0.9 · 15241608192⌋ =
/// ⌊12345702635.52⌋; the CPU ⌊0.9 · 12.7e9⌋ = 11430000000 under 4.x, and 5.x's own 0.9 on top,
/// 10287000000.
#[test]
fn one_gpu_under_bnb_keeps_81_percent() {
    for (model, cpu) in [(load("llama-2-7b"), 10287000000), (load_v4("llama-2-7b"), 11430000000)] {
        let sizing = Sizing::of(&model, &nf4(Workload::default()));
        let budgets = greedy::max_memory(&profile("t4"), &sizing, Strategy::Balanced, Some(&model));
        assert_eq!(
            budgets,
            vec![MaxMemory { tier: gpu(0), bytes: 12345702635 }, MaxMemory { tier: Target::Cpu, bytes: cpu }]
        );
    }
}

/// The reported case under 4.x: Mixtral-8x7B, 4-bit, on Kaggle's two T4s, with 4.x names
/// (`block_sparse_moe.experts.E.w1`, each expert three `nn.Linear`s that bitsandbytes replaces).
///
/// A layer at 4-bit, everything at half a byte: attention 4096·4096·2 + 1024·4096·2 =
/// 41943040, experts 8·3·4096·14336 = 1409286144, the router 8·4096 = 32768, two norms 8192 →
/// 1451270144 · 0.5 = 725635072. Total 32·725635072 + 65536000 (embedding) + 262144000 (head,
/// kept) + 2048 + 32 = 23548004384. Cap on GPU 0: 11774002192 + ⌊1.25 · 725635072⌋ =
/// 12681046032, × 0.9 = 11412941428; GPU 1 13717447372. GPU 0 keeps a layer free:
/// 10687306356 holds the embedding and 14 layers (65536000 + 14·725635072 = 10224427008; a
/// 15th makes 10950062080). GPU 1 takes the other 18 (13061431296), the norm, the rotary
/// buffer and the head (13323577376 ≤ 13717447372).
#[test]
fn mixtral_8x7b_4bit_on_t4x2_under_4x() {
    let model = load_v4("mixtral-8x7b");
    let (budgets, map) = auto(&model, &profile("2xt4"), &nf4(Workload::default()));
    assert_eq!(budgets[0].bytes, 11412941428);
    assert_eq!(budgets[1].bytes, 13717447372);
    let on = |tier: Target| map.iter().filter(|(n, t)| *t == tier && n.starts_with("model.layers.")).count();
    assert_eq!(on(gpu(0)), 14);
    assert_eq!(on(gpu(1)), 18);
    assert!(map.contains(&entry("lm_head", gpu(1))));
    assert!(map.iter().all(|(_, t)| matches!(t, Target::Gpu(_))), "nothing offloaded");
}

/// The reported case under 5.x: the fused experts (`mlp.experts.gate_up_proj` [8, 28672, 4096],
/// `down_proj` [8, 4096, 14336]) are `nn.Parameter`s, not `nn.Linear`s, so bitsandbytes leaves
/// them 16-bit and they are sized so: attention 41943040 · 0.5 = 20971520, experts
/// 1409286144 · 2 = 2818572288, the router 65536, two norms 16384 → 2839625728 per layer. The
/// model (≈ 91.4e9) is far above two T4s, so GPU 0's cap is its budget, ⌊0.9 · 15241608192⌋ =
/// 13717447372, like GPU 1's; the CPU 55662776156.
///
/// GPU 0 keeps a layer free: 10877821644 holds the embedding and 3 layers (262144000 +
/// 3·2839625728 = 8781021184; a 4th makes 11620646912). GPU 1, no main device, holds 4
/// (11358502912; a 5th makes 14198128640). The CPU keeps a layer free: 52823150428 holds 18
/// (51113263104; a 19th makes 53952888832). Layers 25-31, the norm, the rotary buffers and
/// the head go to the disk. (transformers then refuses the map: 4-bit with offload.)
#[test]
fn mixtral_8x7b_4bit_on_t4x2_keeps_fused_experts_16_bit_and_offloads() {
    let model = load("mixtral-8x7b");
    let (budgets, map) = auto(&model, &profile("2xt4"), &nf4(Workload::default()));
    assert_eq!(
        budgets,
        vec![
            MaxMemory { tier: gpu(0), bytes: 13717447372 },
            MaxMemory { tier: gpu(1), bytes: 13717447372 },
            MaxMemory { tier: Target::Cpu, bytes: 55662776156 },
        ]
    );
    let mut expected = vec![entry("model.embed_tokens", gpu(0))];
    expected.extend(layers(0..3, gpu(0)));
    expected.extend(layers(3..7, gpu(1)));
    expected.extend(layers(7..25, Target::Cpu));
    expected.extend(layers(25..32, Target::Disk));
    expected.extend([
        entry("model.norm", Target::Disk),
        entry("model.rotary_emb", Target::Disk),
        entry("lm_head", Target::Disk),
    ]);
    assert_eq!(map, expected);
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

/// accelerate's fill (4.x); [`TOY_SIZING_V5`] for transformers 5.x's.
const TOY_SIZING: Sizing =
    Sizing { dtype: DType::F32, quant: GreedyQuant::None, version: Version::Transformers4 };
const TOY_SIZING_V5: Sizing = Sizing { version: Version::Transformers5, ..TOY_SIZING };

fn budgets(gpu0: u64, gpu1: u64) -> Vec<MaxMemory> {
    vec![
        MaxMemory { tier: gpu(0), bytes: gpu0 },
        MaxMemory { tier: gpu(1), bytes: gpu1 },
        MaxMemory { tier: Target::Cpu, bytes: 1000 },
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
/// `body`'s two layers merge into `body`, a new key that goes to the end of the map (Python's
/// `del` and re-insert in `clean_device_map`). Both versions agree here.
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
    let model = toy(root, &[]);
    let expected = vec![
        entry("emb", gpu(0)),
        entry("head.proj", gpu(0)),
        entry("head.extra", gpu(1)),
        entry("body", gpu(1)),
    ];
    assert_eq!(auto_device_map(&model, &TOY_SIZING, &budgets(250, 1000)), expected);
    assert_eq!(auto_device_map(&model, &TOY_SIZING_V5, &budgets(250, 1000)), expected);
}

/// Where the fills differ: `a` (a `Pair` of `a.p`, 60, and `a.q`, 60) and `c`, a leaf holding
/// a copy tied to `a.p.weight` (0) and its own `bias` (50). GPU 0 has 200. Taking `a` leaves
/// `c` (50) to reserve: room 150. `a` with the `c` it is tied to makes 170: too much; alone (120)
/// it fits, but `c` cannot be split.
/// - accelerate (4.x) splits a module only when it does not fit alone, so `a` moves on to
///   GPU 1, and everything with it: `{"": 1}`.
/// - transformers 5.x splits it anyway ("as last resort"): `a.p` (largest layer now 60, room
///   140) with `c` makes 110 and fits; taking `a.q` leaves nothing to reserve, and 170 ≤ 200:
///   all on GPU 0, `{"": 0}` (uncleaned `a.p`, `c`, `a.q`).
#[test]
fn a_module_too_big_with_its_ties_is_split_by_5x_and_moved_on_by_4x() {
    let c = Module::new("c", "Linear", ModuleKind::Linear)
        .with_tensor(Tensor {
            tied_to: Some("a.p.weight".into()),
            ..Tensor::parameter("weight", &[60], DType::U8)
        })
        .with_tensor(Tensor::parameter("bias", &[50], DType::U8));
    let root = container("", "Toy", vec![container("a", "Pair", vec![leaf("a.p", 60), leaf("a.q", 60)]), c]);
    let model = toy(root, &[]);
    assert_eq!(auto_device_map(&model, &TOY_SIZING, &budgets(200, 1000)), vec![entry("", gpu(1))]);
    assert_eq!(auto_device_map(&model, &TOY_SIZING_V5, &budgets(200, 1000)), vec![entry("", gpu(0))]);
    let raw = Options { fallback_allocation: false, clean_result: false };
    assert_eq!(
        infer_auto_device_map(&model, &TOY_SIZING_V5, &budgets(200, 1000), raw),
        vec![entry("a.p", gpu(0)), entry("c", gpu(0)), entry("a.q", gpu(0))]
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
