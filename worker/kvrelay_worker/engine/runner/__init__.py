"""Running the model on the device: the forward pass of a scheduled batch, CUDA graphs,
pinned staging of inputs, and which device and errors the engine deals with."""
