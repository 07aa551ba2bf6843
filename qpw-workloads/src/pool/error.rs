//! Everything that can go wrong with a pool, and the range check behind most of it.

/// Everything that can go wrong with a pool; messages name the bad input and the range.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A parameter out of range.
    #[error("{what} {value} is out of range: the legal range is {lo}-{hi}")]
    Range {
        /// The parameter.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The smallest legal value.
        lo: usize,
        /// The largest legal value.
        hi: usize,
    },
    /// The calling thread is not on a CPU of the pool's instance.
    #[error(transparent)]
    Qpw(#[from] qpw_core::Error),
    /// A buffer from another pool.
    #[error("buffer {id} belongs to another pool")]
    ForeignBuffer {
        /// The buffer's id.
        id: u32,
    },
    /// A hackbench thread panicked or could not start.
    #[error("hackbench {what} thread failed: {reason}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

pub(super) fn check(
    what: &'static str,
    value: usize,
    lo: usize,
    hi: usize,
) -> Result<(), PoolError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(PoolError::Range {
            what,
            value,
            lo,
            hi,
        })
    }
}
