"""Images in: decoding, data sets, preprocessing, training views.

* :mod:`.decode` -- the one image decoder (files and uploaded bytes -> uint8 pixels);
* :mod:`.datasets` -- Fashion-MNIST, a user's folders and CSV manifests, splits;
* :mod:`.preprocess` -- decoded images of any size -> model inputs
  (:class:`~models.images.preprocess.Preprocess`);
* :mod:`.augment` -- training views on batches (:class:`~models.images.augment.Augment`).
"""
