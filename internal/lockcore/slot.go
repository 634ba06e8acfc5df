package lockcore

// keySlot returns the Redis Cluster hash slot of the keys of the lock whose
// escaped key is tag: every key of one lock has the hash tag {tag}, so this
// is CRC16(tag) mod 16384, as the server computes it.
func keySlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
