//! GPU backends: NVML and a JSON fixture (placeholder until implemented).
