"""Tools, not model code: the needle laboratory, MQAR, the fact generator and fact-recall evaluation, the repeat
probe and the demo. None of this is part of a checkpoint's remote code."""
