//! Everything between the pure stages (`pipelines`) and the outside world: the runtime traits
//! (`runtime`), the embedded log and state store (`embedded`), the statement-provider connector
//! (`statement`), the simulated provider served over HTTP (`wallet_sim_http`) and the pipeline's
//! figures (`metrics`).

pub mod embedded;
pub mod kafka;
pub mod metrics;
pub mod runtime;
pub mod scylla;
pub mod statement;
pub mod wallet_sim_http;
