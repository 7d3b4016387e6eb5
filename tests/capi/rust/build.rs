// Links libckpt_c.so from CKPT_C_LIB_DIR (the build folder that holds it).
fn main() {
    println!("cargo:rerun-if-env-changed=CKPT_C_LIB_DIR");
    if let Ok(dir) = std::env::var("CKPT_C_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    }
    println!("cargo:rustc-link-lib=dylib=ckpt_c");
}
