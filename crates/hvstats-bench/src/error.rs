//! What can stop a bench run: a step of setting up or measuring a row that failed, with its cause.

/// An error running the bench: the step that failed and why.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A step failed for a reason of its own (an I/O error, a partition that could not be made).
    #[error("{step}")]
    Step {
        /// What was being done.
        step: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Something the bench needs was not there (a VP, a published instance).
    #[error("{0}")]
    Missing(String),
    /// A bench guest did not run to its end.
    #[error("{what} faulted: {reason} at {location}")]
    GuestFault {
        /// Which guest.
        what: &'static str,
        /// The fault.
        reason: String,
        /// Where it happened.
        location: String,
    },
}

/// Names the step a fallible call belongs to, as the error's message.
pub(crate) trait Step<T> {
    /// `Err(e)` becomes [`BenchError::Step`] saying `step`, caused by `e`.
    fn step(self, step: impl Into<String>) -> Result<T, BenchError>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Step<T> for Result<T, E> {
    fn step(self, step: impl Into<String>) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::Step { step: step.into(), source: Box::new(e) })
    }
}

/// Names what was missing when an option is `None`.
pub(crate) trait Present<T> {
    /// `None` becomes [`BenchError::Missing`] saying `what`.
    fn present(self, what: &str) -> Result<T, BenchError>;
}

impl<T> Present<T> for Option<T> {
    fn present(self, what: &str) -> Result<T, BenchError> {
        self.ok_or_else(|| BenchError::Missing(what.to_owned()))
    }
}
