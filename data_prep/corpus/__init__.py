"""The corpus front door's stages (data_prep/prepare_corpus.py is its command and local
runner; data_prep/beam/corpus.py runs the same stages on Apache Beam):

  types.py   Options, RawDoc, Cleaned, PrepareError, FORMATS, DROP_REASONS
  read.py    formats, the input list, a reader per format (a file -> RawDoc items)
  wiki.py    MediaWiki exports: the stream cut into pages, a page's wikitext made prose
  clean.py   a document cleaned (-> Cleaned), its fingerprint for deduplication
  output.py  the output files' names, a document's output text, the Summary
  sample.py  --format=sample: the raw sample corpus made into data_prep/sample_corpus
"""
