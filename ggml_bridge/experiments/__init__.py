"""The experiments the project exists for: the bench, the proof ladder, the doctor, the generated models and the paper model."""
