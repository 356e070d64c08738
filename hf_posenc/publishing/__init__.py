"""Writing results out: the patch job (:mod:`.patch_job`), saving and pushing to the Hub (:mod:`.hub`) and the
model card (:mod:`.card`)."""
