fn main() {
    let m = vramplan_profiles::model::load(&std::env::args().nth(1).unwrap(), Default::default()).unwrap();
    let s = m.summary();
    println!("{}", serde_json::to_string_pretty(&s).unwrap());
}
