"""create_pretraining_data and prepare_corpus as Apache Beam pipelines (--runner): the same
output as their local runners, byte for byte, on DirectRunner or a cluster (Dataflow, Flink,
Spark); `pip install .[beam]`.

  records.py  create_pretraining_data's pipeline (`run`)
  corpus.py   prepare_corpus's pipeline (`prepare`)
  options.py  the runner's PipelineOptions, checked before any work
  files.py    Beam's FileSystems as both pipelines read and write them

Importing this package loads no Apache Beam: `load_beam` imports a pipeline only once a
tool's --runner names a Beam runner.
"""

from __future__ import annotations


def load_beam(pipeline: str, runner: str, beam_options: str, error: type[Exception]):
    """The module of `pipeline` ("records": data_prep.beam.records, "corpus":
    data_prep.beam.corpus) once --runner and --beam_options check out, else `error` (the
    calling tool's one-line error) saying how to install Apache Beam or what is wrong with
    them."""
    try:
        # Apache Beam is imported here, not at the top: the local path never loads it.
        from data_prep.beam import options
        if pipeline == "records":
            from data_prep.beam import records as module  # Apache Beam: see above
        else:
            from data_prep.beam import corpus as module  # Apache Beam: see above
    except ImportError as e:
        raise error(f"--runner={runner} needs Apache Beam, which is not installed ({e}); "
                    f"pip install .[beam], or --runner=local") from None
    try:
        options.pipeline_options(runner, beam_options)
    except ValueError as e:
        raise error(str(e)) from None
    return module
