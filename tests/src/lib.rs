//! Helpers shared by the integration tests: where `../shared` is, and running the command line
//! in-process.
