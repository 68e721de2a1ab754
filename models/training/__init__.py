"""Training and evaluation of the image model.

* :mod:`.run` -- the training run (:func:`~models.training.run.train`): schedule, epochs, resume;
* :mod:`.config` -- its options (:class:`~models.training.config.TrainConfig`) and error;
* :mod:`.data` -- the training data, loaded once, checked, split, preprocessed;
* :mod:`.setup` -- the trained modules, the optimiser, the precision;
* :mod:`.validation` -- validation metrics, the novelty rule, the placement's calibration;
* :mod:`.state` -- the checkpoint of an unfinished run;
* :mod:`.losses`, :mod:`.objectives` -- the main loss and the auxiliary objectives;
* :mod:`.features` -- a pretrained backbone's cached features;
* :mod:`.clusters` -- the cluster tree of an unsupervised run as a taxonomy;
* :mod:`.evaluate` -- retrieval, hierarchy, zero-shot and uncertainty metrics.
"""
