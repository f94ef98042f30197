//! Task heads and base models for every family: `{Family}Model`, `{Family}For
//! SequenceClassification`, `…ForTokenClassification`, `…ForQuestionAnswering` (and XLNet's
//! `…ForQuestionAnsweringSimple`, T5's `T5EncoderModel`), where transformers defines the class.
//!
//! One mechanism for all of them: the family's own importer builds its language-model class from
//! the same config, its base model (`model`, `transformer`, `gpt_neox`, …, with every block,
//! buffer and tie inside it) is taken out and moved to the place the task class keeps it (the
//! root for a base model, which has no `model.` prefix), and transformers' head for that family
//! is put beside it with transformers' names. The table below is read from transformers 5.24's
//! modeling files (4.57 builds the same names; `fixtures/reference/heads/` records both):
//! - the decoders built on transformers' generic heads (`modeling_layers.py`):
//!   `GenericForSequenceClassification` is `score` (no bias), `GenericForTokenClassification`
//!   `dropout` + `score` (bias), `GenericForQuestionAnswering` `qa_outputs` (2 outputs) with the
//!   base at `transformer` unless the family names it `model` (Mistral, Mixtral, Qwen2-MoE);
//! - GPT-2, GPTBigCode, GPT-NeoX, Falcon, BLOOM: `score` (no bias) for sequences, `dropout` +
//!   `classifier` for tokens, `qa_outputs` (2); OPT's linears read `word_embed_proj_dim`;
//! - BERT: `bert` keeps its pooler only for sequence classification (`add_pooling_layer=False`
//!   in the token and span classes); `dropout` + `classifier`, `qa_outputs` (`num_labels`);
//! - XLNet: `sequence_summary` (`XLNetSequenceSummary`: `summary` linear, tanh, dropouts) +
//!   `logits_proj`; `classifier`; `qa_outputs` (`num_labels`) in `XLNetForQuestionAnsweringSimple`;
//!   `XLNetForQuestionAnswering`'s `start_logits.dense`, `end_logits.{dense_0, LayerNorm,
//!   dense_1}` and `answer_class.{dense_0, dense_1 (no bias)}`;
//! - the vision-language models (Qwen2.5-VL, Gemma 3, Qwen3-VL, Mistral 3): the base is `model`
//!   (tower, projector, `language_model`), the tower's facts moving with it; Gemma 3's
//!   `Gemma3ForSequenceClassification` adds `score` (no bias, the text model's width);
//! - T5: `T5ForSequenceClassification` is `transformer` (the whole `T5Model`) +
//!   `classification_head.{dense, dropout, out_proj}`; `T5ForTokenClassification` `transformer`
//!   (a `T5EncoderModel`) + `dropout` + `classifier`; `T5ForQuestionAnswering` keeps `shared`,
//!   `encoder`, `decoder` at the root with `qa_outputs` (`num_labels`).
//!
//! No head ties a weight: the language model's tied output embedding goes with its head. The
//! class count is `id2label`'s length when given, else `num_labels`, else 2, as transformers'
//! `PretrainedConfig` decides.

use super::{HfConfig, from_config_unquantized};
use crate::model::{
    Builder, ImportOptions, ModelDescription, Module, ModuleKind, Naming, OutputHead, Tensor,
};
use crate::{DType, InputError};
use serde_json::Value;

/// One piece of a head, in the order the class defines it.
#[derive(Clone, Copy)]
enum Piece {
    /// `nn.Dropout` named so.
    Dropout(&'static str),
    /// `nn.Linear(width, outputs)` named so.
    Linear { name: &'static str, outputs: Outputs, bias: bool },
    /// XLNet's `sequence_summary` (`XLNetSequenceSummary`).
    XlnetSummary,
    /// `XLNetForQuestionAnswering`'s `start_logits`, `end_logits` and `answer_class`.
    XlnetBeam,
    /// T5's `classification_head` (`T5ClassificationHead`).
    T5Classification,
}

/// A linear's output count.
#[derive(Clone, Copy)]
enum Outputs {
    /// The config's class count.
    Labels,
    /// Span start and end.
    Two,
}

/// What the base model keeps in one class.
#[derive(Clone, Copy, PartialEq)]
enum Base {
    /// All of it.
    Whole,
    /// BERT without its pooler (`add_pooling_layer=False`).
    NoPooler,
    /// T5's encoder alone (`T5EncoderModel`).
    Encoder,
}

/// One task class of a family.
#[derive(Clone, Copy)]
struct Task {
    /// The class-name suffix after the family's prefix (`ForSequenceClassification`).
    suffix: &'static str,
    /// Where the base model sits; `""`: its modules at the root beside the head (T5's span
    /// head).
    prefix: &'static str,
    base: Base,
    pieces: &'static [Piece],
    /// What the head produces.
    head: HeadKind,
}

/// The head fact of a task, before the config's numbers are read.
#[derive(Clone, Copy)]
enum HeadKind {
    Sequence,
    Token,
    Span(Outputs),
    XlnetBeam,
}

/// A family: its class-name prefix, the class its importer builds the base from, and its tasks.
struct Family {
    name: &'static str,
    built_from: &'static str,
    /// `word_embed_proj_dim` is the heads' input width (OPT).
    projected: bool,
    tasks: &'static [Task],
}

const SCORE: &[Piece] = &[Piece::Linear { name: "score", outputs: Outputs::Labels, bias: false }];
const DROPOUT_SCORE: &[Piece] =
    &[Piece::Dropout("dropout"), Piece::Linear { name: "score", outputs: Outputs::Labels, bias: true }];
const DROPOUT_CLASSIFIER: &[Piece] =
    &[Piece::Dropout("dropout"), Piece::Linear { name: "classifier", outputs: Outputs::Labels, bias: true }];
const QA_TWO: &[Piece] = &[Piece::Linear { name: "qa_outputs", outputs: Outputs::Two, bias: true }];
const QA_LABELS: &[Piece] = &[Piece::Linear { name: "qa_outputs", outputs: Outputs::Labels, bias: true }];

const fn sequence(prefix: &'static str, pieces: &'static [Piece]) -> Task {
    Task { suffix: "ForSequenceClassification", prefix, base: Base::Whole, pieces, head: HeadKind::Sequence }
}
const fn token(prefix: &'static str, pieces: &'static [Piece]) -> Task {
    Task { suffix: "ForTokenClassification", prefix, base: Base::Whole, pieces, head: HeadKind::Token }
}
const fn span(prefix: &'static str) -> Task {
    Task {
        suffix: "ForQuestionAnswering",
        prefix,
        base: Base::Whole,
        pieces: QA_TWO,
        head: HeadKind::Span(Outputs::Two),
    }
}

/// Llama-style decoders on transformers' generic heads, the span head's base at `qa`.
const fn generic(qa: &'static str) -> [Task; 3] {
    [sequence("model", SCORE), token("model", DROPOUT_SCORE), span(qa)]
}
const LLAMA_QA_AT_TRANSFORMER: [Task; 3] = generic("transformer");
const LLAMA_QA_AT_MODEL: [Task; 3] = generic("model");
const GENERIC_NO_SPAN: [Task; 2] = [sequence("model", SCORE), token("model", DROPOUT_SCORE)];
/// GPT-2-style families: the base at `prefix`, `classifier` for tokens.
const fn gpt(prefix: &'static str) -> [Task; 3] {
    [sequence(prefix, SCORE), token(prefix, DROPOUT_CLASSIFIER), span(prefix)]
}
const GPT_TRANSFORMER: [Task; 3] = gpt("transformer");
const GPT_NEOX: [Task; 3] = gpt("gpt_neox");

const FAMILIES: &[Family] = &[
    Family {
        name: "Llama",
        built_from: "LlamaForCausalLM",
        projected: false,
        tasks: &LLAMA_QA_AT_TRANSFORMER,
    },
    Family { name: "Mistral", built_from: "MistralForCausalLM", projected: false, tasks: &LLAMA_QA_AT_MODEL },
    Family { name: "Mixtral", built_from: "MixtralForCausalLM", projected: false, tasks: &LLAMA_QA_AT_MODEL },
    Family {
        name: "Qwen2",
        built_from: "Qwen2ForCausalLM",
        projected: false,
        tasks: &LLAMA_QA_AT_TRANSFORMER,
    },
    Family {
        name: "Qwen2Moe",
        built_from: "Qwen2MoeForCausalLM",
        projected: false,
        tasks: &LLAMA_QA_AT_MODEL,
    },
    Family {
        name: "Qwen3",
        built_from: "Qwen3ForCausalLM",
        projected: false,
        tasks: &LLAMA_QA_AT_TRANSFORMER,
    },
    Family {
        name: "Qwen3Moe",
        built_from: "Qwen3MoeForCausalLM",
        projected: false,
        tasks: &LLAMA_QA_AT_TRANSFORMER,
    },
    Family { name: "Gemma", built_from: "GemmaForCausalLM", projected: false, tasks: &GENERIC_NO_SPAN },
    Family { name: "Gemma2", built_from: "Gemma2ForCausalLM", projected: false, tasks: &GENERIC_NO_SPAN },
    Family { name: "Phi3", built_from: "Phi3ForCausalLM", projected: false, tasks: &GENERIC_NO_SPAN },
    Family { name: "GptOss", built_from: "GptOssForCausalLM", projected: false, tasks: &GENERIC_NO_SPAN },
    Family { name: "Olmoe", built_from: "OlmoeForCausalLM", projected: false, tasks: &[] },
    Family {
        name: "Gemma3Text",
        built_from: "Gemma3ForCausalLM",
        projected: false,
        tasks: &[sequence("model", SCORE)],
    },
    Family { name: "Granite", built_from: "GraniteForCausalLM", projected: false, tasks: &[] },
    Family {
        name: "SmolLM3",
        built_from: "SmolLM3ForCausalLM",
        projected: false,
        tasks: &LLAMA_QA_AT_TRANSFORMER,
    },
    Family { name: "Llama4Text", built_from: "Llama4ForCausalLM", projected: false, tasks: &[] },
    Family { name: "Glm4", built_from: "Glm4ForCausalLM", projected: false, tasks: &GENERIC_NO_SPAN },
    Family { name: "Cohere2", built_from: "Cohere2ForCausalLM", projected: false, tasks: &[] },
    Family { name: "FalconH1", built_from: "FalconH1ForCausalLM", projected: false, tasks: &[] },
    // The vision-language families: `model` holds the tower, the projector and the language
    // model; Gemma 3's classifier (4.57's own class, 5.x's generic one) is `score` on the text
    // model's width.
    Family {
        name: "Qwen2_5_VL",
        built_from: "Qwen2_5_VLForConditionalGeneration",
        projected: false,
        tasks: &[],
    },
    Family {
        name: "Gemma3",
        built_from: "Gemma3ForConditionalGeneration",
        projected: false,
        tasks: &[sequence("model", SCORE)],
    },
    Family { name: "Qwen3VL", built_from: "Qwen3VLForConditionalGeneration", projected: false, tasks: &[] },
    Family { name: "Mistral3", built_from: "Mistral3ForConditionalGeneration", projected: false, tasks: &[] },
    // Phi-4 multimodal: `model` holds the decoder and, under `embed_tokens_extend`, the image and
    // audio embeddings.
    Family { name: "Phi4Multimodal", built_from: "Phi4MultimodalForCausalLM", projected: false, tasks: &[] },
    Family {
        name: "DeepseekV2",
        built_from: "DeepseekV2ForCausalLM",
        projected: false,
        tasks: &[sequence("model", SCORE)],
    },
    Family {
        name: "DeepseekV3",
        built_from: "DeepseekV3ForCausalLM",
        projected: false,
        tasks: &GENERIC_NO_SPAN,
    },
    Family { name: "Phi", built_from: "PhiForCausalLM", projected: false, tasks: &GENERIC_NO_SPAN },
    Family { name: "GPT2", built_from: "GPT2LMHeadModel", projected: false, tasks: &GPT_TRANSFORMER },
    Family {
        name: "GPTBigCode",
        built_from: "GPTBigCodeForCausalLM",
        projected: false,
        tasks: &[sequence("transformer", SCORE), token("transformer", DROPOUT_CLASSIFIER)],
    },
    Family { name: "GPTNeoX", built_from: "GPTNeoXForCausalLM", projected: false, tasks: &GPT_NEOX },
    Family { name: "Falcon", built_from: "FalconForCausalLM", projected: false, tasks: &GPT_TRANSFORMER },
    Family { name: "Bloom", built_from: "BloomForCausalLM", projected: false, tasks: &GPT_TRANSFORMER },
    Family {
        name: "OPT",
        built_from: "OPTForCausalLM",
        projected: true,
        tasks: &[sequence("model", SCORE), span("model")],
    },
    Family {
        name: "Bert",
        built_from: "BertModel",
        projected: false,
        tasks: &[
            sequence(
                "bert",
                &[
                    Piece::Dropout("dropout"),
                    Piece::Linear { name: "classifier", outputs: Outputs::Labels, bias: true },
                ],
            ),
            Task { base: Base::NoPooler, ..token("bert", DROPOUT_CLASSIFIER) },
            Task {
                base: Base::NoPooler,
                pieces: QA_LABELS,
                head: HeadKind::Span(Outputs::Labels),
                ..span("bert")
            },
        ],
    },
    Family {
        name: "XLNet",
        built_from: "XLNetLMHeadModel",
        projected: false,
        tasks: &[
            sequence(
                "transformer",
                &[
                    Piece::XlnetSummary,
                    Piece::Linear { name: "logits_proj", outputs: Outputs::Labels, bias: true },
                ],
            ),
            token(
                "transformer",
                &[Piece::Linear { name: "classifier", outputs: Outputs::Labels, bias: true }],
            ),
            Task { pieces: &[Piece::XlnetBeam], head: HeadKind::XlnetBeam, ..span("transformer") },
            Task {
                suffix: "ForQuestionAnsweringSimple",
                pieces: QA_LABELS,
                head: HeadKind::Span(Outputs::Labels),
                ..span("transformer")
            },
        ],
    },
    Family {
        name: "T5",
        built_from: "T5ForConditionalGeneration",
        projected: false,
        tasks: &[
            sequence("transformer", &[Piece::T5Classification]),
            Task { base: Base::Encoder, ..token("transformer", DROPOUT_CLASSIFIER) },
            Task { pieces: QA_LABELS, head: HeadKind::Span(Outputs::Labels), ..span("") },
            Task {
                suffix: "EncoderModel",
                prefix: "",
                base: Base::Encoder,
                pieces: &[],
                head: HeadKind::Sequence,
            },
        ],
    },
];

/// What `arch` names: a family and one of its tasks, or its base model (`None`).
fn parse(arch: &str) -> Option<(&'static Family, Option<&'static Task>)> {
    FAMILIES.iter().find_map(|family| {
        let rest = arch.strip_prefix(family.name)?;
        if rest == "Model" {
            return Some((family, None));
        }
        family.tasks.iter().find(|t| t.suffix == rest).map(|t| (family, Some(t)))
    })
}

/// Whether `arch` is a base model or task-head class vramplan builds here.
pub(crate) fn builds(arch: &str) -> bool {
    // `BertModel` and `BertForMaskedLM` are BERT's own importer's.
    arch != "BertModel" && parse(arch).is_some()
}

/// Every class built here, for the list of supported classes.
pub fn classes() -> Vec<String> {
    let mut out = Vec::new();
    for family in FAMILIES {
        if family.name != "Bert" {
            out.push(format!("{}Model", family.name));
        }
        out.extend(family.tasks.iter().map(|t| format!("{}{}", family.name, t.suffix)));
    }
    out
}

/// Builds `arch` (a class [`builds`] accepts) from `config`.
pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let (family, task) = parse(arch).ok_or_else(|| InputError::new(config.origin(), format!("`{arch}`")))?;
    let mut object = config.object().clone();
    object.insert("architectures".into(), Value::from(vec![family.built_from]));
    let language_model = from_config_unquantized(&HfConfig::from_object(object, config.origin()), options)?;
    let mut base = base_model(language_model, task.map_or(Base::Whole, |t| t.base), family.name);
    if family.name.starts_with("Deepseek") && options.naming == Naming::V5 {
        // transformers 5.24's `DeepseekV2/V3PreTrainedModel` keeps the router's weight in fp32
        // (`_keep_in_fp32_modules_strict = [..., "gate.weight"]`, new since 5.23, whose fixture
        // the causal LM's importer still follows), so every class built here holds it in fp32.
        base.root.visit_mut(&mut |m| {
            if m.path.ends_with(".mlp.gate") {
                for t in m.tensors.iter_mut().filter(|t| t.name == "weight") {
                    *t = Tensor::fixed_parameter("weight", &t.shape, DType::F32);
                }
            }
        });
    }
    let Some(task) = task else {
        // `T5EncoderModel`, `T5Model`, `LlamaModel`, …: the base alone, at the root.
        let mut base = base;
        base.architecture = arch.into();
        base.facts.head = OutputHead::None;
        return Ok(base);
    };
    let mut notes = base.notes.clone();
    let labels = label_count(config, base.naming, &mut notes)?;
    let width = if family.projected {
        config.positive_or(&["word_embed_proj_dim"], base.facts.hidden_size)?
    } else {
        base.facts.hidden_size
    };
    let b = Builder::new(base.dtype, options.naming);
    let mut pieces = Vec::new();
    for piece in task.pieces {
        pieces.extend(head_modules(&b, config, *piece, width, labels)?);
    }
    let mut description = base;
    let base_root = std::mem::replace(&mut description.root, Module::new("", arch, ModuleKind::Container));
    let mut root = if task.prefix.is_empty() {
        Module { class: arch.into(), ..base_root }
    } else {
        let mut moved = base_root;
        reroot(&mut moved, "", task.prefix);
        Module::new("", arch, ModuleKind::Container).with_child(moved)
    };
    move_facts(&mut description, "", task.prefix);
    root.children.extend(pieces);
    description.root = root;
    description.architecture = arch.into();
    description.notes = notes;
    description.facts.head = match task.head {
        HeadKind::Sequence if task.pieces.is_empty() => OutputHead::None,
        HeadKind::Sequence => OutputHead::SequenceClassification { labels },
        HeadKind::Token => OutputHead::TokenClassification { labels },
        HeadKind::Span(Outputs::Two) => OutputHead::QuestionAnswering { outputs: 2 },
        HeadKind::Span(Outputs::Labels) => OutputHead::QuestionAnswering { outputs: labels },
        HeadKind::XlnetBeam => OutputHead::XlnetBeam { start_top: config.positive_or(&["start_n_top"], 5)? },
    };
    Ok(description)
}

/// The base model of `language_model` at the root: the child its blocks are under (`model`,
/// `transformer`, `gpt_neox`; a vision-language model's `model`, which holds its tower's blocks
/// first) moved up; BERT's importer builds `BertModel` itself; T5's base is
/// the root without `lm_head` (and without the decoder for `keep` = [`Base::Encoder`]). The head
/// and its tie go; the facts follow (layers moved, no tied output embedding).
fn base_model(mut model: ModelDescription, keep: Base, family: &str) -> ModelDescription {
    let mut root = std::mem::replace(&mut model.root, Module::new("", "", ModuleKind::Container));
    match family {
        "Bert" => {}
        "T5" => {
            let encoder_only = keep == Base::Encoder;
            root.children.retain(|c| c.path != "lm_head" && !(encoder_only && c.path == "decoder"));
            root.class = if encoder_only { "T5EncoderModel" } else { "T5Model" }.into();
            model.facts.layers.retain(|l| !encoder_only || l.path.starts_with("encoder."));
        }
        _ => {
            let first_layer = model.facts.layers.first().map(|l| l.path.clone()).unwrap_or_default();
            let under = |c: &Module| first_layer.strip_prefix(&c.path).is_some_and(|r| r.starts_with('.'));
            if let Some(at) = root.children.iter().position(under) {
                let prefix = root.children[at].path.clone();
                let mut base = root.children.swap_remove(at);
                reroot(&mut base, &prefix, "");
                move_facts(&mut model, &prefix, "");
                root = base;
            }
        }
    }
    if keep == Base::NoPooler {
        root.children.retain(|c| c.path != "pooler");
    }
    model.root = root;
    model.facts.tie_word_embeddings = false;
    model
}

/// Moves the paths `model`'s facts name (its layers, a vision tower's) from under `from` to
/// under `to`, as its tree moved.
fn move_facts(model: &mut ModelDescription, from: &str, to: &str) {
    for layer in &mut model.facts.layers {
        layer.path = moved_path(&layer.path, from, to);
    }
    if let Some(vision) = &mut model.facts.vision {
        vision.path = moved_path(&vision.path, from, to);
        for idle in &mut vision.idle_paths {
            *idle = moved_path(idle, from, to);
        }
        if let Some(first) = &mut vision.runs_first {
            *first = moved_path(first, from, to);
        }
    }
}

/// The modules of one head piece.
fn head_modules(
    b: &Builder,
    config: &HfConfig,
    piece: Piece,
    width: u64,
    labels: u64,
) -> Result<Vec<Module>, InputError> {
    let count = |outputs: Outputs| match outputs {
        Outputs::Labels => labels,
        Outputs::Two => 2,
    };
    Ok(match piece {
        Piece::Dropout(name) => vec![b.dropout("", name)],
        Piece::Linear { name, outputs, bias } => vec![b.linear("", name, width, count(outputs), bias)],
        Piece::XlnetSummary => {
            // modeling_xlnet.py `XLNetSequenceSummary.__init__`: `summary` when `summary_use_proj`
            // (to `num_labels` with `summary_proj_to_labels`), tanh for `summary_activation`.
            let mut summary = b.container("", "sequence_summary", "XLNetSequenceSummary");
            if config.bool_or(&["summary_use_proj"], true)? {
                let to_labels = config.bool_or(&["summary_proj_to_labels"], false)?;
                let out = if to_labels { labels } else { width };
                summary = summary.with_child(b.linear("sequence_summary", "summary", width, out, true));
            }
            let tanh = config.string_opt(&["summary_activation"])?.as_deref() == Some("tanh");
            summary = summary.with_child(Module::new(
                "sequence_summary.activation",
                if tanh { "Tanh" } else { "Identity" },
                ModuleKind::Other,
            ));
            vec![
                summary
                    .with_child(b.dropout("sequence_summary", "first_dropout"))
                    .with_child(b.dropout("sequence_summary", "last_dropout")),
            ]
        }
        Piece::XlnetBeam => vec![
            b.container("", "start_logits", "XLNetPoolerStartLogits").with_child(b.linear(
                "start_logits",
                "dense",
                width,
                1,
                true,
            )),
            b.container("", "end_logits", "XLNetPoolerEndLogits")
                .with_child(b.linear("end_logits", "dense_0", 2 * width, width, true))
                .with_child(Module::new("end_logits.activation", "Tanh", ModuleKind::Other))
                .with_child(b.norm("end_logits", "LayerNorm", "LayerNorm", width, true))
                .with_child(b.linear("end_logits", "dense_1", width, 1, true)),
            b.container("", "answer_class", "XLNetPoolerAnswerClass")
                .with_child(b.linear("answer_class", "dense_0", 2 * width, width, true))
                .with_child(Module::new("answer_class.activation", "Tanh", ModuleKind::Other))
                .with_child(b.linear("answer_class", "dense_1", width, 1, false)),
        ],
        Piece::T5Classification => vec![
            b.container("", "classification_head", "T5ClassificationHead")
                .with_child(b.linear("classification_head", "dense", width, width, true))
                .with_child(b.dropout("classification_head", "dropout"))
                .with_child(b.linear("classification_head", "out_proj", width, labels, true)),
        ],
    })
}

/// `path` moved from under `from` to under `to` (either may be the root, `""`).
pub(super) fn moved_path(path: &str, from: &str, to: &str) -> String {
    let rest = if from.is_empty() {
        Some(path)
    } else if path == from {
        Some("")
    } else {
        path.strip_prefix(from).and_then(|r| r.strip_prefix('.'))
    };
    match rest {
        Some(rest) => crate::model::join(to, rest).trim_end_matches('.').to_string(),
        None => path.to_string(),
    }
}

/// Moves `module` and everything below it, tied targets included, from under `from` to under
/// `to`.
pub(super) fn reroot(module: &mut Module, from: &str, to: &str) {
    module.visit_mut(&mut |m| {
        m.path = moved_path(&m.path, from, to);
        for tensor in &mut m.tensors {
            if let Some(target) = &mut tensor.tied_to {
                *target = moved_path(target, from, to);
            }
        }
    });
}

/// The classifier's output count as each transformers version reads a config that gives it:
/// 5.x sets `num_labels` after `id2label`, so `num_labels` wins (its setter rebuilds the map);
/// 4.x keeps `id2label` and takes its length. Without either, 2. A disagreement is noted in
/// `notes`. (Checked with `AutoConfig.from_pretrained` of both: 5.24 gives 3 and 4.57 gives 7
/// for `num_labels: 3` beside a 7-entry `id2label`.)
pub(crate) fn label_count(
    config: &HfConfig,
    naming: Naming,
    notes: &mut Vec<String>,
) -> Result<u64, InputError> {
    let from_map = match config.get(&["id2label"]) {
        None => None,
        Some((_, Value::Object(map))) => Some(map.len() as u64),
        Some((key, _)) => {
            return Err(InputError::new(config.origin(), "expected an object mapping label ids to names")
                .at_key(key)
                .with_fix("write it as {\"0\": \"NEGATIVE\", \"1\": \"POSITIVE\"}, or give `num_labels`"));
        }
    };
    let declared = config.opt_positive(&["num_labels"])?;
    match (from_map, declared) {
        (Some(0), _) => {
            Err(InputError::new(config.origin(), "`id2label` is empty: the classifier has no labels")
                .at_key("id2label")
                .with_fix("list at least one label"))
        }
        (Some(count), Some(declared)) if count != declared => {
            let used = if naming == Naming::V5 { declared } else { count };
            notes.push(format!(
                "num_labels {declared} disagrees with the {count} entries of id2label; transformers {} uses {used}",
                if naming == Naming::V5 { "5.x" } else { "4.x" }
            ));
            Ok(used)
        }
        (Some(count), _) => Ok(count),
        (None, Some(declared)) => Ok(declared),
        (None, None) => Ok(2),
    }
}

/// The tasks a custom model's `head:` may name, with the class-name suffix each builds.
pub(crate) const TASKS: &[(&str, &str)] = &[
    ("none", "Model"),
    ("sequence_classification", "ForSequenceClassification"),
    ("token_classification", "ForTokenClassification"),
    ("question_answering", "ForQuestionAnswering"),
    ("question_answering_simple", "ForQuestionAnsweringSimple"),
];

/// The class of `arch`'s family for `task` (a [`TASKS`] name), or the tasks the family has.
pub(crate) fn class_for(arch: &str, task: &str) -> Result<String, Vec<&'static str>> {
    let family = FAMILIES.iter().find(|f| {
        f.built_from == arch
            || (arch == "BertForMaskedLM" && f.name == "Bert")
            || parse(arch).is_some_and(|(p, _)| std::ptr::eq(p, *f))
    });
    let Some(family) = family else { return Err(Vec::new()) };
    let offered: Vec<&'static str> = TASKS
        .iter()
        .filter(|(_, suffix)| *suffix == "Model" || family.tasks.iter().any(|t| t.suffix == *suffix))
        .map(|(name, _)| *name)
        .collect();
    match TASKS.iter().find(|(name, _)| *name == task) {
        Some((name, suffix)) if offered.contains(name) => Ok(format!("{}{suffix}", family.name)),
        _ => Err(offered),
    }
}
