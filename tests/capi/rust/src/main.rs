//! Lists a checkpoint through the C ABI (include/ckpt/ckpt_c.h): one line per tensor with its
//! name, dtype, shape, bytes and the CRC32 of its bytes, read into a Vec the program owns.
//! `ckpt_c_rust FILE`, or `ckpt_c_rust --missing PATH` for the error path.
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::process::exit;

#[repr(C)]
struct Options {
    _private: [u8; 0],
}
#[repr(C)]
struct Checkpoint {
    _private: [u8; 0],
}

#[repr(C)]
struct TensorInfo {
    struct_size: usize,
    name: *const c_char,
    dtype: *const c_char,
    element_size: usize,
    ndim: usize,
    shape: *const i64,
    strides: *const i64,
    nbytes: u64,
    file_offset: u64,
    file_index: usize,
    contiguous: c_int,
}

extern "C" {
    fn ckpt_version() -> *const c_char;
    fn ckpt_status_name(status: c_int) -> *const c_char;
    fn ckpt_last_error() -> *const c_char;
    fn ckpt_open(path: *const c_char, options: *const Options, out: *mut *mut Checkpoint) -> c_int;
    fn ckpt_close(checkpoint: *mut Checkpoint);
    fn ckpt_format(checkpoint: *const Checkpoint) -> *const c_char;
    fn ckpt_tensor_count(checkpoint: *const Checkpoint) -> usize;
    fn ckpt_tensor_info_at(checkpoint: *const Checkpoint, index: usize, info: *mut TensorInfo) -> c_int;
    fn ckpt_read_tensor(checkpoint: *const Checkpoint, index: usize, dst: *mut c_void,
                        dst_bytes: usize, options: *const Options) -> c_int;
}

fn text(p: *const c_char) -> String {
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = (c >> 1) ^ (0xEDB8_8320 & 0u32.wrapping_sub(c & 1));
        }
    }
    !c
}

fn fail(status: c_int, what: &str) -> ! {
    let name = text(unsafe { ckpt_status_name(status) });
    eprintln!("{what}: {name}: {}", text(unsafe { ckpt_last_error() }));
    exit(status)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (path, missing) = match args.as_slice() {
        [_, flag, p] if flag == "--missing" => (p.clone(), true),
        [_, p] => (p.clone(), false),
        _ => {
            eprintln!("usage: ckpt_c_rust FILE | --missing PATH");
            exit(64)
        }
    };
    let cpath = CString::new(path).expect("a path without NUL");
    let mut c: *mut Checkpoint = std::ptr::null_mut();
    let status = unsafe { ckpt_open(cpath.as_ptr(), std::ptr::null(), &mut c) };
    if missing {
        let name = text(unsafe { ckpt_status_name(status) });
        println!("{status}\t{name}\t{}\t{}", c.is_null(), text(unsafe { ckpt_last_error() }));
        return;
    }
    if status != 0 {
        fail(status, "ckpt_open")
    }
    println!("version\t{}", text(unsafe { ckpt_version() }));
    println!("format\t{}", text(unsafe { ckpt_format(c) }));
    for i in 0..unsafe { ckpt_tensor_count(c) } {
        let mut info: TensorInfo = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<TensorInfo>();
        let s = unsafe { ckpt_tensor_info_at(c, i, &mut info) };
        if s != 0 {
            fail(s, "ckpt_tensor_info_at")
        }
        // The ABI promises a non-NULL shape pointer, also for a 0-d tensor.
        assert!(!info.shape.is_null());
        let shape = unsafe { std::slice::from_raw_parts(info.shape, info.ndim) };
        let mut bytes = vec![0u8; info.nbytes as usize];
        let s = unsafe {
            ckpt_read_tensor(c, i, bytes.as_mut_ptr() as *mut c_void, bytes.len(), std::ptr::null())
        };
        if s != 0 {
            fail(s, "ckpt_read_tensor")
        }
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        println!("{}\t{}\t[{}]\t{}\t{:08x}", text(info.name), text(info.dtype), dims.join(","),
                 info.nbytes, crc32(&bytes));
    }
    unsafe { ckpt_close(c) };
}
