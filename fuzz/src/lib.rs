//! Generators and checks shared by the fuzz targets in fuzz_targets/: the fuzzer's bytes become
//! structured input (tar archives, KDL projects, proxy requests) so that it reaches the code
//! that makes decisions, not only the first parser's error path.

pub mod fixture;
pub mod kdl_gen;
pub mod overflow;
pub mod proxy_gen;
pub mod tar_gen;
pub mod tree;
