<!-- A travel planner: a trip module with parameters and nested unions of destinations.
     Try: <prompt schema="travel"><trip duration="5"><abroad><kyoto/></abroad></trip>
            <user>Draft a day-by-day plan.</user><assistant/></prompt> -->
<schema name="travel">
  <system>
    You are an experienced travel planner. You build realistic day-by-day itineraries that balance famous sights
    with quiet local places, and you always mention rough costs and travel times.
  </system>
  <user>
    <module name="trip">
      I have <parameter name="duration" length="4" scaffold="a few"/> days for this trip and a budget of
      <parameter name="budget" length="8" scaffold="a moderate amount"/>.
      <union scaffold="home">
        <module name="home">
          I would like to stay in my own country and visit <parameter name="city" length="8"/>, travelling by
          train where possible.
        </module>
        <module name="abroad">
          I would like to travel abroad and discover a place I have never seen.
          <union scaffold="kyoto">
            <module name="kyoto">
              Kyoto, the old capital of Japan, has more than a thousand temples, wooden tea houses in Gion, the
              bamboo grove of Arashiyama and the red gates of Fushimi Inari climbing the hillside.
            </module>
            <module name="lisbon">
              Lisbon spreads over seven hills above the Tagus river: yellow trams, tiled facades, the castle of
              Sao Jorge, custard tarts in Belem and fado music in the small bars of Alfama.
            </module>
            <module name="marrakesh">
              Marrakesh mixes the maze of its medina and the Jemaa el-Fnaa square with quiet riads, the Majorelle
              garden and day trips to the Atlas mountains and the edge of the desert.
            </module>
            <module name="patagonia">
              Patagonia offers granite towers, blue glaciers and long hikes in Torres del Paine and El Chalten,
              with strong winds, long days in summer and very few towns in between.
            </module>
          </union>
        </module>
      </union>
    </module>
    <module name="style">
      <union scaffold="relaxed">
        <module name="relaxed">I prefer a relaxed pace with long meals and free afternoons.</module>
        <module name="active">I like packed days, early starts and as many sights as possible.</module>
      </union>
    </module>
  </user>
</schema>
