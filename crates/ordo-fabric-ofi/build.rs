//! Builds the C shim over libfabric when the `ofi` feature is on; without
//! it, nothing (the crate is empty and needs no system library).

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_OFI").is_none() {
        return;
    }
    let lib = match pkg_config::Config::new().atleast_version("1.17").probe("libfabric") {
        Ok(lib) => lib,
        Err(e) => panic!(
            "the `ofi` feature needs libfabric >= 1.17 and its headers, found with pkg-config \
             (Debian: apt-get install libfabric-dev pkg-config): {e}"
        ),
    };
    let mut build = cc::Build::new();
    build.file("csrc/shim.c").warnings(true).flag_if_supported("-Wno-unused-parameter");
    for path in &lib.include_paths {
        build.include(path);
    }
    build.compile("ordo_ofi_shim");
}
