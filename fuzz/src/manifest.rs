//! The instance manifest parser and instance names, checked on arbitrary bytes.
//!
//! This function is the body of the `manifest` fuzz target and of the workspace test that feeds it
//! random and mutated manifests. `read_manifest` must return a manifest of the format this build
//! reads, or an error; never panic. A manifest it accepts must survive a write and a read
//! unchanged, and an instance name it parses must print back as the same text (without leading
//! zeros or signs, which the writer never produces).

use std::path::Path;

use hvstats::publish::{InstanceName, MANIFEST_FILE, MANIFEST_FORMAT, read_manifest};

/// Parses `data` as the manifest of the instance directory `dir` (written there first) and as an
/// instance name, and checks the contract. Returns whether the manifest was accepted.
pub fn check(data: &[u8], dir: &Path) -> bool {
    let path = dir.join(MANIFEST_FILE);
    std::fs::write(&path, data).expect("write the manifest under test");
    let accepted = match read_manifest(dir) {
        Ok(manifest) => {
            assert_eq!(manifest.format, MANIFEST_FORMAT);
            let again = serde_json::to_vec(&manifest).expect("a manifest encodes");
            std::fs::write(&path, again).expect("write the manifest again");
            assert_eq!(read_manifest(dir).expect("a manifest written reads back"), manifest);
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    };
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(name) = InstanceName::parse(text) {
            let canonical = name.to_string();
            let reparsed = InstanceName::parse(&canonical).expect("a printed name parses");
            assert_eq!(reparsed, name);
        }
    }
    accepted
}

/// A valid manifest, for seeds and mutation.
pub fn sample() -> Vec<u8> {
    format!(
        r#"{{"format":{MANIFEST_FORMAT},"pid":4242,"start_time":99,"created_unix_ms":1700000000000,"logical_processors":[{{"index":0,"cpu":0}},{{"index":1,"cpu":2}}],"partitions":[{{"id":1,"vp_count":2,"active":true}}]}}"#
    )
    .into_bytes()
}
