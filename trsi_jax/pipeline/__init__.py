"""The five-stage Terminal-RSI pipeline (bootstrap -> base -> RSR-1 -> RPR-1 -> RSR-2 -> RPR-2)."""
from trsi_jax.pipeline.config import PIPELINE_PRESETS, PipelineConfig, pipeline_preset
from trsi_jax.pipeline.run import STAGES, Pipeline, built_in_tasks

__all__ = ["PIPELINE_PRESETS", "STAGES", "Pipeline", "PipelineConfig", "built_in_tasks", "pipeline_preset"]
