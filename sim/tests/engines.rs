//! scratch
use vramplan_profiles::model::{ImportOptions, load};
#[test]
#[ignore]
fn dump() {
    for name in ["llama-3.1-8b-instruct", "mixtral-8x7b", "deepseek-v2-lite", "llama-2-7b"] {
        let m = load(name, ImportOptions::default()).unwrap();
        println!("== {name} {:?}", m.facts);
        for (p, t) in m.tensors() {
            if p.contains("layers.") && !p.contains("layers.0.") && !p.contains("layers.1.") {
                continue;
            }
            println!("{p} {:?} {:?} {:?} {:?}", t.shape, t.dtype, t.kind, t.tied_to);
        }
    }
}
