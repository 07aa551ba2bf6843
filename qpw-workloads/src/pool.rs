//! Not written yet: see the workloads issue.
