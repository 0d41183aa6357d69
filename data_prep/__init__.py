"""Corpus tools: raw text -> TFRecords of masked sentence pairs (create_pretraining_data),
vocabularies (build_vocab), raw corpora -> the input format (prepare_corpus, its stages in
corpus/); beam/ runs both tools on Apache Beam.

An installed package: training from raw text calls create_pretraining_data.create in
process, and the sample corpus and uncased BERT's vocabulary ship with it as package data.
"""

import os

# Files beside this module, installed or in a checkout. Plain paths, not importlib.resources
# traversables: tokenizers and tf.data open them by name, and a run records its vocabulary's
# path in its checkpoints.
_HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_CORPUS = os.path.join(_HERE, "sample_corpus")   # *.txt, in the input format
SAMPLE_VOCAB = os.path.join(_HERE, "bert_uncased_vocab.txt")  # uncased BERT's WordPiece
