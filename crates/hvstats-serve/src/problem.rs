//! What a web configuration (or the basic authentication it sets up) asks that cannot be done,
//! and why: a [`Problem`], made by [`refuse!`] or from a library's error by
//! [`Because::because`]. [`crate::web::WebConfigError`] says in which file.

/// What a web configuration asks that cannot be done, and why (with the error behind it, when
/// there is one).
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub(crate) struct Problem {
    what: String,
    #[source]
    cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Problem {
    /// A problem said by `what` alone.
    pub(crate) fn new(what: impl Into<String>) -> Self {
        Self { what: what.into(), cause: None }
    }
}

/// Returns a [`Problem`] said by a format string.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err(crate::problem::Problem::new(format!($($arg)*)))
    };
}
pub(crate) use refuse;

/// An error of a library, as a [`Problem`] saying what it stopped.
pub(crate) trait Because<T> {
    /// The error as the cause of `what`.
    fn because(self, what: impl Into<String>) -> Result<T, Problem>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Because<T> for Result<T, E> {
    fn because(self, what: impl Into<String>) -> Result<T, Problem> {
        self.map_err(|e| Problem { what: what.into(), cause: Some(Box::new(e)) })
    }
}
