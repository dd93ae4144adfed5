<!-- Code assistant over a small project: one module per source file, loaded verbatim with src= (so the code
     needs no escaping and keeps its indentation), plus a union of tasks. Try:
     <prompt schema="code-generation"><inventory.py/><orders.py/><task><tests/></task><assistant/></prompt> -->
<schema name="code-generation">
  <system>
    You are a careful Python developer. You read the files of the project below and answer with code that fits
    its style. Keep changes small and explain them in one or two sentences.
  </system>
  <user>
    Here are files of the project, a small bookshop.
    <module name="inventory.py" src="code-generation/inventory.py"/>
    <module name="orders.py" src="code-generation/orders.py"/>
    <module name="report.py" src="code-generation/report.py"/>
    <module name="task">
      <union scaffold="review">
        <module name="review">Review the files above and point out bugs or unclear code.</module>
        <module name="tests">Write pytest tests for the files above, one test per behaviour.</module>
        <module name="feature">
          Add a discount to orders: <parameter name="percent" length="4" scaffold="10"/> percent off orders
          above fifty euros.
        </module>
      </union>
    </module>
  </user>
</schema>
