fn main() {
    std::process::exit(aisb::run(std::env::args_os()));
}
