//! What a checkpoint's tensors say about its layout, for the generic model: the blocks, each
//! block's attention projections (separate or fused, `[out, in]` or GPT-2's `[in, out]`) and
//! their widths, whether the blocks are of one kind, the MLP's width and gating, the experts,
//! the norms, the token embedding and the output head.

use super::super::super::names;
use crate::DType;
use crate::model::{Module, ModuleKind, NormKind, TensorKind, join};
use std::collections::{BTreeMap, BTreeSet};

/// Attention projection names: separate query, key and value, or one fused projection.
const QUERY: &[&str] = &["q_proj", "query", "q", "wq", "q_lin"];
const KEY: &[&str] = &["k_proj", "key", "k", "wk", "k_lin"];
const VALUE: &[&str] = &["v_proj", "value", "v", "wv", "v_lin"];
const FUSED_QKV: &[&str] = &["qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv", "W_pack", "wqkv"];
/// Names of a causal LM's output head.
const OUTPUT_HEADS: &[&str] = &["lm_head", "embed_out", "output", "lm_loss", "output_layer"];

/// The blocks' paths, in order.
pub(super) fn block_paths(root: &Module) -> Vec<String> {
    let mut blocks = Vec::new();
    root.visit(&mut |m| {
        if m.kind == ModuleKind::Block {
            blocks.push(m.path.clone());
        }
    });
    blocks
}

/// The 2-D float weight of a linear-like leaf, `[rows, columns]` as stored.
fn matrix(module: &Module) -> Option<(u64, u64)> {
    let weight = module.tensors.iter().find(|t| t.name == "weight" && t.kind == TensorKind::Parameter)?;
    match weight.shape.as_slice() {
        [rows, columns] if weight.dtype.is_float() => Some((*rows, *columns)),
        _ => None,
    }
}

/// A block's attention projections, as found by name.
pub(super) struct Attention {
    /// (path, [rows, columns]) of q, k and v, or of the fused projection.
    projections: Vec<(String, (u64, u64))>,
    fused: bool,
    /// The attention's module paths (the parents of the projections).
    parents: BTreeSet<String>,
}

/// What the attention check found.
pub(super) struct AttentionCheck {
    /// Key/value heads the projections hold.
    pub kv_heads: u64,
    /// The weights are stored `[in, out]` (GPT-2's `Conv1D`).
    pub transposed: bool,
    /// The projections are stored quantized: their widths were not checked.
    pub unchecked: bool,
}

pub(super) fn attention(block: &Module) -> Option<Attention> {
    let mut by_name: BTreeMap<&str, Vec<&Module>> = BTreeMap::new();
    block.visit(&mut |m| {
        if m.children.is_empty() {
            by_name.entry(m.name()).or_default().push(m);
        }
    });
    let pick = |names: &[&str]| names.iter().find_map(|n| by_name.get(n).and_then(|v| v.first().copied()));
    let with_matrix = |m: &Module| (m.path.clone(), matrix(m).unwrap_or((0, 0)));
    let parent = |m: &Module| names::split(&m.path).0.to_string();
    if let (Some(q), Some(k), Some(v)) = (pick(QUERY), pick(KEY), pick(VALUE)) {
        return Some(Attention {
            projections: vec![with_matrix(q), with_matrix(k), with_matrix(v)],
            fused: false,
            parents: [parent(q), parent(k), parent(v)].into_iter().collect(),
        });
    }
    let fused = pick(FUSED_QKV)?;
    Some(Attention { projections: vec![with_matrix(fused)], fused: true, parents: [parent(fused)].into() })
}

impl Attention {
    /// Checks the projections' widths against heads × head_dim; on a mismatch, which size
    /// (`heads` or `kv`) and the problem.
    pub(super) fn check(
        &self,
        hidden: u64,
        heads: u64,
        d: u64,
        kv_given: Option<u64>,
    ) -> Result<AttentionCheck, (&'static str, String)> {
        if self.projections.iter().any(|(_, shape)| *shape == (0, 0)) {
            // Stored quantized (packed words, no float weight): nothing to read widths from.
            return Ok(AttentionCheck {
                kv_heads: kv_given.unwrap_or(heads),
                transposed: false,
                unchecked: true,
            });
        }
        // `[out, in]` (nn.Linear) or `[in, out]` (Conv1D): the side that is not the hidden size.
        let out = |(rows, columns): (u64, u64)| -> Option<(u64, bool)> {
            if columns == hidden {
                Some((rows, false))
            } else if rows == hidden {
                Some((columns, true))
            } else {
                None
            }
        };
        let unreadable = |path: &str, shape: (u64, u64)| {
            (
                "heads",
                format!(
                    "`{path}.weight` is [{}, {}], neither side the hidden size {hidden} (or not a float matrix)",
                    shape.0, shape.1
                ),
            )
        };
        let q_width = heads * d;
        if self.fused {
            let (path, shape) = &self.projections[0];
            let (width, transposed) = out(*shape).ok_or_else(|| unreadable(path, *shape))?;
            let kv = match kv_given {
                Some(kv) => kv,
                None if width > q_width && (width - q_width).is_multiple_of(2 * d) => {
                    (width - q_width) / (2 * d)
                }
                None => 0,
            };
            if width != (heads + 2 * kv) * d {
                let which = if kv_given.is_some() { "kv" } else { "heads" };
                return Err((
                    which,
                    format!(
                        "`{path}.weight` is [{}, {}]: {width} outputs, where (num_attention_heads + 2 × \
                         num_key_value_heads) × head_dim = ({heads} + 2 × {kv}) × {d} = {}",
                        shape.0,
                        shape.1,
                        (heads + 2 * kv) * d
                    ),
                ));
            }
            return Ok(AttentionCheck { kv_heads: kv, transposed, unchecked: false });
        }
        let (q_path, q_shape) = &self.projections[0];
        let (q_out, transposed) = out(*q_shape).ok_or_else(|| unreadable(q_path, *q_shape))?;
        if q_out != q_width {
            return Err((
                "heads",
                format!(
                    "`{q_path}.weight` is [{}, {}]: {q_out} outputs, where num_attention_heads × head_dim = \
                     {heads} × {d} = {q_width}",
                    q_shape.0, q_shape.1
                ),
            ));
        }
        let mut kv_heads = None;
        for (path, shape) in &self.projections[1..] {
            let (width, _) = out(*shape).ok_or_else(|| unreadable(path, *shape))?;
            let expected = kv_given.map(|kv| kv * d);
            let found = width / d;
            if expected.is_some_and(|e| e != width)
                || !width.is_multiple_of(d)
                || kv_heads.is_some_and(|k| k != found)
            {
                return Err((
                    "kv",
                    format!(
                        "`{path}.weight` is [{}, {}]: {width} outputs, where num_key_value_heads × head_dim = \
                         {} × {d}",
                        shape.0,
                        shape.1,
                        kv_given.map_or_else(
                            || "(from the key projection) ".to_string()
                                + &kv_heads.unwrap_or(found).to_string(),
                            |k| k.to_string()
                        )
                    ),
                ));
            }
            kv_heads = Some(found);
        }
        Ok(AttentionCheck { kv_heads: kv_heads.unwrap_or(heads), transposed, unchecked: false })
    }
}

/// Refuses blocks that differ outside their MLP: each block's tensor names (relative, list
/// indices as `N`) and shapes must equal the first block's, but for what lies under the one
/// child that holds the experts in the MoE blocks (a dense MLP in its place is a dense layer).
pub(super) fn uniform_blocks(root: &Module, blocks: &[String]) -> Result<(), String> {
    let signature = |path: &str| -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        if let Some(block) = root.find(path) {
            block.visit(&mut |m| {
                for t in &m.tensors {
                    let full = join(&m.path, &t.name);
                    // Shapes too: blocks whose MLPs (or heads) differ in width are not one kind.
                    names.insert(format!("{} {:?}", names::pattern(&full[path.len() + 1..]), t.shape));
                }
            });
        }
        names
    };
    let first = signature(&blocks[0]);
    for block in &blocks[1..] {
        let this = signature(block);
        if this == first {
            continue;
        }
        let differing: Vec<&String> = first.symmetric_difference(&this).collect();
        let children: BTreeSet<&str> = differing.iter().map(|n| n.split('.').next().unwrap_or("")).collect();
        let has_experts = |names: &BTreeSet<String>| names.iter().any(|n| n.contains("experts"));
        let mlp_only = children.len() == 1 && (has_experts(&first) != has_experts(&this));
        if !mlp_only {
            let shown: Vec<String> = differing.iter().take(6).map(|n| format!("`{n}`")).collect();
            return Err(format!(
                "block `{block}` differs from `{}` in {} tensors ({}{}), beyond a dense or mixture-of-experts \
                 MLP: the generic decoder layer describes blocks of one kind",
                blocks[0],
                differing.len(),
                shown.join(", "),
                if differing.len() > 6 { ", …" } else { "" }
            ));
        }
    }
    Ok(())
}

/// Gives fused experts (5.x names: a module `experts` holding 3-D tensors, experts first) the
/// experts kind.
pub(super) fn mark_fused_experts(root: &mut Module) {
    root.visit_mut(&mut |m| {
        if m.name() == "experts" && m.children.is_empty() {
            let counts: BTreeSet<u64> =
                m.tensors.iter().filter(|t| t.shape.len() == 3).map(|t| t.shape[0]).collect();
            if counts.len() == 1 {
                let count = counts.into_iter().next().unwrap_or(0);
                m.kind = ModuleKind::Experts { count: u32::try_from(count).unwrap_or(u32::MAX) };
            }
        }
    });
}

/// Per MoE block: experts, one expert's width, and whether it is gated.
pub(super) fn expert_counts(
    root: &Module,
    blocks: &[String],
    hidden: u64,
) -> BTreeMap<String, (u32, u64, bool)> {
    let mut out = BTreeMap::new();
    for block in blocks {
        let Some(module) = root.find(block) else { continue };
        let mut found = None;
        module.visit(&mut |m| {
            if let ModuleKind::Experts { count } = m.kind
                && found.is_none()
            {
                found = Some((count, m));
            }
        });
        let Some((count, experts)) = found else { continue };
        // One expert's matrices, with the experts' dimension dropped where they are fused.
        let mut dims: Vec<Vec<u64>> = Vec::new();
        match experts.children.first() {
            Some(first) => first.visit(&mut |m| {
                if let Some((r, c)) = matrix(m) {
                    dims.push(vec![r, c]);
                }
            }),
            None => dims
                .extend(experts.tensors.iter().filter(|t| t.shape.len() == 3).map(|t| t.shape[1..].to_vec())),
        }
        let widths: Vec<u64> = dims.iter().flatten().copied().filter(|d| *d != hidden).collect();
        let width = widths.iter().copied().min().unwrap_or(0);
        let elements: u64 = dims.iter().map(|d| d.iter().product::<u64>()).sum();
        out.insert(block.clone(), (count, width, gated_by_size(elements, hidden, width)));
    }
    out
}

/// A gated MLP (gate, up and down, or a fused gate and up with down) holds three matrices of
/// `hidden × width`, a plain one two.
fn gated_by_size(elements: u64, hidden: u64, width: u64) -> bool {
    width > 0 && 2 * elements >= 5 * hidden * width
}

/// The widths besides `hidden` of a dense block's matrices outside its attention.
pub(super) fn mlp_widths(block: &Module, hidden: u64) -> Vec<u64> {
    let attention = attention(block).map(|a| a.parents).unwrap_or_default();
    let mut widths = Vec::new();
    block.visit(&mut |m| {
        let inside_attention = attention.iter().any(|p| m.path == *p || m.path.starts_with(&format!("{p}.")));
        if inside_attention {
            return;
        }
        if let Some((r, c)) = matrix(m) {
            widths.extend([r, c].into_iter().filter(|d| *d != hidden));
        }
    });
    widths.sort_unstable();
    widths.dedup();
    widths
}

/// Whether a dense block's MLP (its matrices outside the attention) is gated.
pub(super) fn mlp_gated(block: &Module, hidden: u64, intermediate: u64) -> bool {
    let attention = attention(block).map(|a| a.parents).unwrap_or_default();
    let (mut elements, mut linears) = (0, 0);
    block.visit(&mut |m| {
        if attention.iter().any(|p| m.path == *p || m.path.starts_with(&format!("{p}."))) {
            return;
        }
        if let Some((r, c)) = matrix(m) {
            elements += r * c;
        }
        linears += usize::from(m.kind == ModuleKind::Linear);
    });
    // Quantized weights have no float matrix to measure: gate, up and down are three linears.
    if elements == 0 { linears >= 3 } else { gated_by_size(elements, hidden, intermediate) }
}

/// RMSNorm unless the blocks' norms have biases (LayerNorm).
pub(super) fn norm_kind(root: &Module, blocks: &[String]) -> NormKind {
    let mut biased = false;
    for block in blocks.iter().take(1) {
        if let Some(module) = root.find(block) {
            module.visit(&mut |m| {
                biased |= m.kind == ModuleKind::Norm && m.tensors.iter().any(|t| t.name == "bias");
            });
        }
    }
    if biased { NormKind::LayerNorm } else { NormKind::RmsNorm }
}

/// The output head among the modules outside the blocks: a module named as transformers names
/// a causal LM's head, holding a 2-D weight.
pub(super) fn output_head(root: &Module, in_block: &dyn Fn(&str) -> bool) -> Option<String> {
    let mut found = None;
    root.visit(&mut |m| {
        if found.is_none()
            && !in_block(&m.path)
            && OUTPUT_HEADS.contains(&m.name())
            && m.tensors.iter().any(|t| t.name == "weight" && t.shape.len() == 2)
        {
            found = Some(m.path.clone());
        }
    });
    found
}

/// The token embedding: an embedding outside the blocks with `vocab` rows (the most rows when
/// the config does not say), not the output head: (path, rows, width).
pub(super) fn token_embedding(
    root: &Module,
    in_block: &dyn Fn(&str) -> bool,
    vocab: Option<u64>,
    head: Option<&str>,
) -> Option<(String, u64, u64)> {
    let mut candidates: Vec<(String, u64, u64)> = Vec::new();
    root.visit(&mut |m| {
        if m.kind != ModuleKind::Embedding || in_block(&m.path) || Some(m.path.as_str()) == head {
            return;
        }
        if let Some(t) = m.tensors.iter().find(|t| t.name == "weight")
            && let [rows, width] = t.shape.as_slice()
        {
            candidates.push((m.path.clone(), *rows, *width));
        }
    });
    candidates
        .iter()
        .find(|(_, rows, _)| Some(*rows) == vocab)
        .or_else(|| candidates.iter().max_by_key(|(_, rows, _)| *rows))
        .cloned()
}

/// The dominant floating-point dtype of the tree's parameters (for a head the checkpoint left
/// out).
pub(super) fn dominant_of(root: &Module) -> DType {
    let mut counts: BTreeMap<DType, u64> = BTreeMap::new();
    root.visit(&mut |m| {
        for t in m.tensors.iter().filter(|t| t.kind == TensorKind::Parameter && t.dtype.is_float()) {
            *counts.entry(t.dtype).or_default() += t.numel();
        }
    });
    counts.into_iter().max_by_key(|(_, n)| *n).map_or(DType::F32, |(d, _)| d)
}

/// GPT-2's `Conv1D` stores weights `[in, out]`: the blocks' linear layers get its class, which
/// the simulator reads the input width by.
pub(super) fn mark_conv1d(root: &mut Module, blocks: &[String]) {
    for block in blocks {
        if let Some(module) = root.find_mut(block) {
            module.visit_mut(&mut |m| {
                if m.kind == ModuleKind::Linear {
                    m.class = "Conv1D".into();
                }
            });
        }
    }
}
