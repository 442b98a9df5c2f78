//! Every fuzz target over its corpus, and over mutations of it: the fuzzers' checks in
//! `cargo test`, the same in every run (a fixed seed), so that what AFL++ found stays found.

use std::path::{Path, PathBuf};

use hark_testkit::Rng;

/// Mutated inputs tried per target.
const MUTATIONS: usize = 20_000;

/// What mutations splice in: the pieces the parsers look for.
const PIECES: &[&[u8]] = &[
    b"[CQ:",
    b"]",
    b",",
    b"=",
    b"&#44;",
    b"&#91;",
    b"&amp;",
    b"&#x1F600;",
    b"&#1114112;",
    b"<quote id=\"1\">",
    b"</quote>",
    b"<at id=\"me\"/>",
    b"<author id=\"2\"/>",
    b"\"",
    b"{",
    b"}",
    b"[",
    b"null",
    b"-1",
    b"99999999999999999999999",
    b"*/",
    b"-",
    b"7",
    b"\n",
    b"\xe4\xb8\xad",
    b"\xff",
];

/// Draws below `n`, as an index.
fn below(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[below(rng, seeds.len())].clone();
    for _ in 0..=below(rng, 4) {
        let at = below(rng, data.len() + 1);
        match below(rng, 6) {
            0 if !data.is_empty() => {
                let i = below(rng, data.len());
                data[i] ^= 1 << below(rng, 8);
            }
            1 if !data.is_empty() => {
                let end = (at + 1 + below(rng, 8)).min(data.len());
                data.drain(at.min(end)..end);
            }
            2 => {
                let piece = PIECES[below(rng, PIECES.len())];
                data.splice(at..at, piece.iter().copied());
            }
            3 => {
                let other = &seeds[below(rng, seeds.len())];
                let from = below(rng, other.len() + 1);
                let to = (from + below(rng, 64)).min(other.len());
                data.splice(at..at, other[from..to].iter().copied());
            }
            4 => data.truncate(at),
            _ => data.insert(at, rng.next_u64() as u8),
        }
    }
    data
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let data = std::fs::read(&path).expect("a corpus file");
            (path, data)
        })
        .collect()
}

#[test]
fn every_target_holds_over_its_corpus_and_mutations_of_it() {
    for (name, target) in hark_fuzz::TARGETS {
        let seeds = corpus(name);
        assert!(
            seeds.len() >= 3,
            "corpus/{name} holds {} inputs; seed it with real ones",
            seeds.len()
        );
        for (path, data) in &seeds {
            if let Err(panic) = std::panic::catch_unwind(|| target(data)) {
                panic!("{name} fails on {}: {panic:?}", path.display());
            }
        }
        let seeds: Vec<Vec<u8>> = seeds.into_iter().map(|(_, d)| d).collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
        for _ in 0..MUTATIONS {
            let data = mutate(&mut rng, &seeds);
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                panic!(
                    "{name} fails on {:?} (put it in corpus/{name}/ when it is fixed)",
                    String::from_utf8_lossy(&data)
                );
            }
        }
    }
}
