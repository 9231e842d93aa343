package tcp

// twice moves a, then b once a has gone whole, with op: what it moved
// in all, or the first call's error; the second call's error, after the
// first moved something, is left for the caller's next call to meet.
func twice(fd int, a, b []byte, op func(int, []byte) (int, error)) (int, error) {
	n := 0
	if len(a) > 0 {
		var err error
		if n, err = op(fd, a); err != nil || n < len(a) {
			return n, err
		}
	}
	if len(b) == 0 {
		return n, nil
	}
	m, err := op(fd, b)
	switch {
	case err != nil && n > 0:
		return n, nil
	case err != nil:
		return m, err
	}
	return n + m, nil
}
