"""Load on a served runtime (``leyline-bench serve | chaos``) and the documents' examples run against one."""
