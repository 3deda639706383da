//! The sandbox's init as its own small binary (see `aisb::init`).
fn main() {
    std::process::exit(aisb::init::main_from_args(std::env::args_os().skip(1)));
}
