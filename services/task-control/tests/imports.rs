//! The modules of this crate import one another without a circle, so that each can be read,
//! tested and changed from the ones below it.

#[test]
fn the_modules_import_one_another_without_a_circle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycles = hark_testkit::import_cycles(&src);
    assert!(cycles.is_empty(), "modules in a circle: {cycles:?}");
}
