//! Human output: tables for `inspect`, `profiles`, `estimate` and `plan`, and (to come) plots
//! with plotters and markdown reports. Text only; the command line prints what these return.
