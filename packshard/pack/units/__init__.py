"""Work units: the inputs cut into units, each mapped by a worker, merged by the driver.

``map`` reads, tokenizes, labels and spills one unit; ``stored`` writes and reads back its part
(arrays and completion marker); ``merge`` makes the units' local lines, codes and ids global;
``parts`` reads the parts back as one flat token space; ``scale`` runs the stages on an engine
and keeps the work folder; ``resume`` decides what ``--resume`` may reuse.
"""
