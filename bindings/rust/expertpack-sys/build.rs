//! Links libexpertpack. Where it is found, in order:
//! 1. `EXPERTPACK_LIB_DIR`: a folder holding libexpertpack.so (a build folder or an install's lib/);
//! 2. `pkg-config --libs-only-L expertpack` (an installed library; `PKG_CONFIG_PATH` is honoured);
//! 3. the linker's default search path.
//! Set `EXPERTPACK_STATIC=1` to link libexpertpack.a instead (then its private dependencies
//! come from `pkg-config --static`).
use std::env;
use std::process::Command;

fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).arg("expertpack").output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

fn main() {
    println!("cargo:rerun-if-env-changed=EXPERTPACK_LIB_DIR");
    println!("cargo:rerun-if-env-changed=EXPERTPACK_STATIC");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let want_static = env::var("EXPERTPACK_STATIC").map(|v| v == "1").unwrap_or(false);
    if let Ok(dir) = env::var("EXPERTPACK_LIB_DIR") {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:root={}", dir);
    } else if let Some(libs) = pkg_config(&["--libs-only-L"]) {
        for flag in libs.split_whitespace() {
            if let Some(dir) = flag.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={}", dir);
            }
        }
    }
    if want_static {
        println!("cargo:rustc-link-lib=static=expertpack");
        if let Some(libs) = pkg_config(&["--static", "--libs-only-l"]) {
            for flag in libs.split_whitespace() {
                if let Some(name) = flag.strip_prefix("-l") {
                    if name != "expertpack" {
                        println!("cargo:rustc-link-lib={}", name);
                    }
                }
            }
        }
        println!("cargo:rustc-link-lib=stdc++");
    } else {
        println!("cargo:rustc-link-lib=dylib=expertpack");
    }
}
