"""What the broker's parts say to each other, with no behaviour of their own: the models
both the protocol (:mod:`broker.protocol`) and the store (:mod:`broker.store`) use, so that
neither imports the other for them."""
