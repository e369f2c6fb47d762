//! Sets `cfg(scylla_uri)` when `SCYLLA_URI` is set at build time: the ScyllaDB conformance test then
//! runs; without it `cargo test` reports that test as ignored with
//! `SKIPPED: ScyllaDB conformance (SCYLLA_URI is not set)`.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(scylla_uri)");
    println!("cargo::rerun-if-env-changed=SCYLLA_URI");
    if std::env::var_os("SCYLLA_URI").is_some_and(|uri| !uri.is_empty()) {
        println!("cargo::rustc-cfg=scylla_uri");
    }
}
