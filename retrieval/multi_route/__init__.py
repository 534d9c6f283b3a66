"""Plan-guided multi-route retrieval over the structured evidence indexes (LycheeMemory
sections 3.4-3.5, appendix B.2, C.3-C.4; docs/design.md §7): plan types and the two planners,
the memory bank of one user, the recall channels, fusion, diversity-aware selection, the optional
cross-encoder reranker and the retriever that runs them. Constants are in ``params``."""
