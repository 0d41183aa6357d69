"""The PipelineOptions of a tool's --runner and --beam_options, checked before any work."""

from __future__ import annotations

import shlex

from apache_beam.options.pipeline_options import PipelineOptions


def pipeline_options(runner: str, beam_options: str = "") -> PipelineOptions:
    """The PipelineOptions of --runner and --beam_options, checked before any work starts:
    ValueError in one line for a runner Beam does not know or options that do not parse."""
    from apache_beam.runners.runner import create_runner

    try:
        create_runner(runner)
    except ValueError:
        raise ValueError(f"--runner={runner}: not a Beam runner; use local, DirectRunner, "
                         f"DataflowRunner, FlinkRunner, SparkRunner or a PipelineRunner "
                         f"subclass's qualified name") from None
    try:
        return PipelineOptions([f"--runner={runner}"] + shlex.split(beam_options))
    except ValueError as e:
        raise ValueError(f"--beam_options={beam_options!r}: {e}") from None
