"""Memory side of MemCode: AMU store, segmenter, extractors, codebook topology, dense index,
dual-path retrieval and the LoCoMo evaluation. Needs only an exported fingerprinter (``isq``),
never the training code or Lightning."""
