"""The image model: encoders (:mod:`.encoders`, the pretrained :mod:`.backbones`),
hyperbolic heads (:mod:`.heads`), the loaded model (:mod:`.image_model`), the cone
placement (:mod:`.placement`), the novelty score (:mod:`.novelty`) and the
ImageNet-pretrained model placed in the WordNet ball (:mod:`.pretrained`)."""
