//! What a task head adds to a training step in place of vocabulary logits
//! (`ArchFacts::head`): its logits, the loss over them, and what the head's own modules keep
//! for backward. A language model's logits and loss are the program's own
//! (`program.rs`, "Loss"); a base model (`OutputHead::None`) has no loss of transformers' making.
//!
//! Sources, transformers 5.24:
//! - sequence classification (`GenericForSequenceClassification`, `BertForSequenceClassification`,
//!   …): `labels` logits per sequence, `CrossEntropyLoss` over them (`loss_utils.py`,
//!   `ForSequenceClassificationLoss`);
//! - token classification: `labels` logits per token, cross-entropy per token
//!   (`ForTokenClassification`);
//! - question answering (`qa_outputs`): start and end logits per token, cross-entropy of each
//!   over the sequence (`ForQuestionAnsweringLoss`);
//! - XLNet's beam head in training (`XLNetForQuestionAnswering.forward` with `start_positions`
//!   and `end_positions`): `start_logits.dense` keeps its input (`c·h`); `end_logits` takes the
//!   hidden states and the start token's gathered and expanded to every position, concatenated
//!   (`[b, i, 2h]`), through `dense_0` (keeps its half copy, `2·c·h`), `tanh` (its output,
//!   `c·h`), `LayerNorm` (its fp32 input, `4·h` under autocast) and `dense_1` (its input,
//!   `c·h`); the gathered hidden states are kept in the residual dtype (`r·h`). The answer
//!   class runs only with `cls_index` and `is_impossible` (SQuAD 2.0 features), not counted.
//!
//! Each loss upcasts the logits to fp32 (`logits.float()`, or autocast's fp32 `cross_entropy`)
//! and keeps its log-softmax; backward makes the gradient of the same size. These are a few
//! KiB for a classifier, and are charged as the program charges a language model's.

use super::precision::Precision;
use crate::workload::{Mode, Workload};
use vramplan_profiles::model::{ModelDescription, OutputHead};

/// A task head's charges for one training step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskHead {
    /// Kept from the head's forward to its backward: its modules' saved tensors and the
    /// logits' fp32 log-softmax.
    pub kept: Vec<u64>,
    /// Live while the loss and its gradient are made: the fp32 logits and their gradient.
    pub loss_transient: u64,
}

/// The charges of `model`'s head when it is a task head in training; `None` for a language
/// model (the program's own logits), a base model, or inference.
pub(crate) fn task_head(
    model: &ModelDescription,
    workload: &Workload,
    precision: &Precision,
) -> Option<TaskHead> {
    if workload.mode != Mode::Train {
        return None;
    }
    let (b, s) = (workload.batch, workload.seq);
    let h = model.facts.hidden_size;
    let c = precision.compute_bytes();
    let r = if precision.autocast { 4 } else { c };
    let up = precision.upcast_bytes();
    let (logits, mut kept) = match model.facts.head {
        OutputHead::LanguageModel | OutputHead::None => return None,
        OutputHead::SequenceClassification { labels } => (b * labels, Vec::new()),
        OutputHead::TokenClassification { labels } => (b * s * labels, Vec::new()),
        OutputHead::QuestionAnswering { outputs } => (b * s * outputs, Vec::new()),
        OutputHead::XlnetBeam { .. } => {
            let tokens = b * s;
            let kept = vec![c * h, r * h, 2 * c * h, c * h, up * h, c * h].into_iter().map(|x| x * tokens);
            (2 * tokens, kept.collect())
        }
    };
    kept.push(4 * logits); // log-softmax, fp32
    Some(TaskHead { kept, loss_transient: (c + 4 + 4) * logits })
}
